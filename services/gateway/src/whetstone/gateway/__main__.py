"""`python -m whetstone.gateway`: the public gateway alone (upstreams from WHETSTONE_GATEWAY_*)."""

from .server import main

if __name__ == "__main__":
    main()
