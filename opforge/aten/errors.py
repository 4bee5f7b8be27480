"""The error of the ATen bridge (:mod:`.bridge` and the modules it uses), in a module of its own
so that every one of them can raise it without importing the others."""


class BridgeError(RuntimeError):
    """The bridge cannot export this call; the message names the op and the reason."""
