"""What differs per payment provider, one package each (xhub/, standard/), and the registry
that names them (registry.py); everything below the signature check is shared."""
