"""The model as data: loading and saving (external data, over 2 GB, atomic), validation, repair, shapes and values."""
