"""Decode-cost arithmetic from bytes (`bounds`: lower bounds, speculative decoding, projections) and
its text (`render`). Pure arithmetic over measured bytes: nothing here loads a model."""
