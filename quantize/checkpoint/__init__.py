"""A checkpoint folder: its files, identity and safety checks (`files`), the one model loader and device
choice, the embedded default model (`loader`), and true bits per weight from the safetensors headers
(`accounting`, `render`). Nothing here decides or scores."""
