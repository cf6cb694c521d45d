"""Evidence packs: the inputs and results of a run, hashed into a manifest signed with Ed25519.

``pack.build`` copies the files into a directory with ``manifest.json`` (sha256 per file,
tool and vLLM version, creation time), ``manifest.sig.json`` (Ed25519 over the canonical
manifest) and ``signing-key.pub``; ``pack.verify`` re-checks every file and the signature
and names the first thing that does not match. ``keys`` makes and loads the signing keys.
"""
