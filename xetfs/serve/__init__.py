"""``xetfs serve``: a store as an offline Hugging Face endpoint for huggingface_hub, hf_xet and transformers.

Modules, from the bottom: ``signing`` (HMAC-signed tokens and URLs),
``access`` (user tokens), ``reconstruction`` (the CAS answer for a byte
range, pure), ``hub`` (catalogue lookups and tree entries, pure),
``contents`` (the one door to the store and the verified read path),
``common`` (settings, state, error answers), ``hubapi`` and ``cas`` (the
routes), and ``app`` (the ASGI application); its command is ``xetfs.commands.serve``.
"""
