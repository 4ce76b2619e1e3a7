//! PyTorch's memory-snapshot format (a pickle with `segments` and `device_traces`), which pytorch.org/memory_viz opens.
