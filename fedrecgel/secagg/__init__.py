"""Secure aggregation: the server learns the sum of a cohort's uploads, not any single one.

:mod:`.protocol` (client side, the round's public parameters and the threat model),
:mod:`.server` (routing and unmasking), :mod:`.local` (a whole round in one process),
:mod:`.shamir` (t-of-n sharing), :mod:`.crypto` (X25519, HKDF, AES-GCM, AES-CTR from
``cryptography``) and :mod:`.layout` (a model update as one fixed-length vector). The ring encoding and its
overflow bound are :mod:`fedrecgel.fixedpoint`, outside this package: the run settings
validate with it, and this package imports the settings.
"""
