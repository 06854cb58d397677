"""Gradient modes with torch's names: no_grad, enable_grad, inference_mode, set_grad_enabled.
Each is a context manager and a decorator (`@loom.no_grad()`, also bare `@loom.no_grad`),
as torch.autograd.grad_mode's; a decorated function enters a fresh mode on every call, so
recursion and threads (the mode is per thread, as the trace) are safe."""
import functools
import inspect

from . import _loom


class _GradMode:
    """Base: subclasses set `_enabled` (the mode inside; None leaves it as it is)."""

    _enabled = False

    def __new__(cls, orig_func=None, *args, **kwargs):
        self = super().__new__(cls)
        if callable(orig_func) and not args and not kwargs and cls._takes_function:
            cls.__init__(self)
            return self(orig_func)  # bare @loom.no_grad
        return self

    _takes_function = True

    def __init__(self, orig_func=None):
        self._previous = []

    def _mode(self):
        return self._enabled

    def __enter__(self):
        mode = self._mode()
        self._previous.append(_loom.is_grad_enabled())
        if mode is not None:
            _loom._set_grad_enabled(mode)
        return None

    def __exit__(self, *exc):
        _loom._set_grad_enabled(self._previous.pop())
        return False

    def _fresh(self):
        return type(self)()

    def __call__(self, fn):
        if inspect.isgeneratorfunction(fn):
            @functools.wraps(fn)
            def gen(*args, **kwargs):
                it = fn(*args, **kwargs)
                with self._fresh():
                    request = next(it)
                while True:
                    try:
                        sent = yield request
                    except GeneratorExit:
                        it.close()
                        raise
                    except BaseException as e:  # noqa: BLE001  (passed into the generator)
                        with self._fresh():
                            request = it.throw(e)
                        continue
                    with self._fresh():
                        try:
                            request = it.send(sent)
                        except StopIteration as stop:
                            return stop.value
            return gen

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with self._fresh():
                return fn(*args, **kwargs)
        return wrapped

    def clone(self):
        return self._fresh()


class no_grad(_GradMode):
    """Context manager and decorator: nothing inside records gradients (optimizer updates,
    evaluation), as torch.no_grad."""

    _enabled = False


class enable_grad(_GradMode):
    """Context manager and decorator: gradients are recorded inside, even within no_grad, as
    torch.enable_grad."""

    _enabled = True


class inference_mode(_GradMode):
    """torch.inference_mode: no_grad under another name (loom has no version counters to
    skip); inference_mode(False) changes nothing."""

    def __init__(self, mode=True):
        super().__init__()
        self.mode = bool(mode)

    def _mode(self):
        return False if self.mode else None

    def _fresh(self):
        return inference_mode(self.mode)


class set_grad_enabled(_GradMode):
    """set_grad_enabled(mode): sets gradient recording on or off for this thread at once (as a
    function), or for a `with` block / a decorated function, restoring it after."""

    _takes_function = False

    def __init__(self, mode):
        if not isinstance(mode, bool):
            raise TypeError(f"set_grad_enabled(): argument 'mode' must be bool, got "
                            f"{type(mode).__name__}")
        self._previous = [_loom.is_grad_enabled()]
        self.mode = mode
        _loom._set_grad_enabled(mode)

    def _mode(self):
        return self.mode

    def __enter__(self):
        # the constructor already set the mode and saved the previous one
        if not self._previous:
            self._previous.append(_loom.is_grad_enabled())
            _loom._set_grad_enabled(self.mode)
        return None

    def _fresh(self):
        prev = _loom.is_grad_enabled()
        m = set_grad_enabled(self.mode)
        m._previous = [prev]
        return m

    def __call__(self, fn):
        _loom._set_grad_enabled(self._previous.pop())  # as a decorator it sets nothing now
        return super().__call__(fn)
