"""What the suites measure marlbuf against, written here: the NumPy buffers every gain is quoted
against (:mod:`~marlbuf.bench.baselines.numpy_buffers`), the EPyMARL-style padded episode
buffer (:mod:`~marlbuf.bench.baselines.padded_episodes`) and the training loops that consume
batches (:mod:`~marlbuf.bench.baselines.consumers`). The peer libraries (cpprb, TorchRL) are
used as installed, by the suites that compare with them."""
