"""Two stand-in consumers: small, complete PyTorch MADDPG loops written the way popular
MADDPG codebases write them, each with its own NumPy replay buffer and with marlbuf swapped in.

* :mod:`marlbuf.bench.baselines.consumers.per_agent` — one buffer object per agent
  (``buffers[i].add(obs, act, rew, next_obs, done)``; a trainer draws its indices with
  ``np.random.choice(len, B, replace=False)`` and calls ``sample_index(idx)`` on every agent's
  buffer). marlbuf enters through :func:`marlbuf.compat.maddpg.make_buffers`.
* :mod:`marlbuf.bench.baselines.consumers.joint` — one joint buffer with
  ``push(obs_n, act_n, rew_n, next_obs_n, done_n)`` and ``sample(B)`` returning per-agent lists
  of tensors (rewards normalised by the stored rewards' mean and standard deviation). marlbuf
  enters through a twenty-line wrapper over :class:`~marlbuf.MultiAgentReplayBuffer`.

They exist to measure what a user who swaps marlbuf into such a code base gets, end to end
(``marlbuf bench dropin``), and to check that the swap leaves learning unchanged
(``tests/bench/test_dropin_suite.py``). Both run on :func:`marlbuf.envs.make`'s cooperative
navigation with continuous actions.
"""
