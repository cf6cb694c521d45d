"""vllm-perimeter: a default-deny perimeter for vLLM's OpenAI-compatible server.

Data flows through one seam per stage::

    inventory -> plan (inventory + policy) -> generate (NGINX, Envoy)
                                           -> probe -> findings -> report

Each seam has an ``interface.py`` with its models' base error; all errors
derive from :class:`scanner.errors.PerimeterError`.
"""

__version__ = "0.1.0"
