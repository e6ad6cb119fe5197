"""The partition spec of a sharded array as JSON-ready lists (the subprocess cases report them)."""


def spec_of(x):
    """``x``'s sharding spec, one entry per dim (None: not split; a list: split over several axes)."""
    spec = tuple(x.sharding.spec) + (None,) * (x.ndim - len(x.sharding.spec))
    return [list(e) if isinstance(e, tuple) else e for e in spec]
