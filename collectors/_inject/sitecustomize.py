# pardiag's hook into every Python process started under `pardiag run`.
# It must never break the process: every failure is recorded and swallowed, and
# the sitecustomize that would have run without pardiag still runs afterwards.


def _pardiag_activate() -> None:
    try:
        from pardiag.collectors import bootstrap
    except BaseException as e:  # pardiag not importable by this interpreter
        try:
            import os
            import sys
            import socket

            run = os.environ.get("PARDIAG_RUN_DIR")
            if run:
                d = os.path.join(run, "logs", "bootstrap")
                os.makedirs(d, exist_ok=True)
                name = "%s.%d.txt" % (socket.gethostname(), os.getpid())
                with open(os.path.join(d, name), "w") as f:
                    f.write("pardiag could not be imported by %s: %r\n" % (sys.executable, e))
        except BaseException:
            pass
        return
    try:
        bootstrap.activate()
    except BaseException:
        pass


def _pardiag_chain() -> None:
    """Run the sitecustomize that pardiag's own shadows on sys.path, if any."""
    try:
        import importlib.machinery
        import importlib.util
        import os
        import sys

        here = os.path.dirname(os.path.abspath(__file__))
        rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None:
            return
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)
    except BaseException:
        import traceback

        traceback.print_exc()


_pardiag_activate()
_pardiag_chain()
