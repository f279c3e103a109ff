"""What a node measures and how it reaches CloudWatch: the metric names both sides read,
the EMF lines, and the readers of GPUs (nvidia-smi, DCGM), EFA counters and XID errors."""
