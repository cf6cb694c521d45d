"""The closed loop on loopback: generate, validate, start and probe the proxy in front of the
stand-in and its witness.

* :mod:`scanner.verify.loop`: one proxy (the throwaway setup: keys, loopback networks, test CA
  and issuer; the proxy started on a free port; the probe run);
* :mod:`scanner.verify.mutation`: ``--mutate``, each mutation operator's weakened config caught;
* :mod:`scanner.verify.fleet`: ``--replicas N``, a fleet with the limiter and Redis, the outage;
* :mod:`scanner.verify.demo`: ``vllm-perimeter demo``, on the embedded defaults.
"""
