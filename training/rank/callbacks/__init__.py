"""What happens around the training loop's steps (loop.py): health, checkpoints, faults, logging, throughput."""
