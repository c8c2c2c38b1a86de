"""Where evaluation meets decisions: the gate as a command runs it (`gate`), sizing a golden set (`size`)
and agreement over many checkpoints (`agree`). The only package that imports both `evaluate` and `gates`."""
