"""What the machine gives: the CPU and its peak (`cpu`), `--device` (`devices`), memory a run will need (`memory`), FLOPs per token and MFU (`flops`), and `scratchlm doctor`."""
