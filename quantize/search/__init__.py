"""`quantize search`: mixed precision under a byte budget, checked by the gate (run.py)."""
