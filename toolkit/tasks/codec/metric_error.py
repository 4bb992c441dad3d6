"""The error of a codec metric that cannot score a pair (toolkit.tasks.codec.metrics), in a
module of its own so that the metric implementations and their registry both import it."""
from toolkit.errors import UserError


class MetricError(UserError, ValueError):
    """A metric that cannot score a (reference, decoded) pair."""
