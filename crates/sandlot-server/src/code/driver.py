# The code context driver: runs inside a sandbox, started by the daemon with
# `python3 -c BOOTSTRAP`; the first line of its stdin is this source as a JSON
# string, the second its configuration. It starts a Jupyter kernel (ipykernel for
# Python, a kernelspec of the language otherwise) and relays between the daemon and
# the kernel as JSON lines: requests on stdin, events on stdout. The daemon trusts
# nothing it says (it bounds and parses every line); the caps here only spare the
# pipe. For bash without a Jupyter kernel it runs one persistent bash itself, and
# for javascript without one a persistent node.
import json
import os
import queue
import signal
import time
import subprocess
import sys
import tempfile
import threading

# Bytes of stream text relayed per cell before a truncation marker; the daemon
# holds its own (equal) cap.
STREAM_CAP = 8 << 20
# A single result bundle larger than this is replaced by a note.
RESULT_CAP = 12 << 20
TRUNCATED = "\n[output truncated: the cell wrote more than 8 MiB]\n"

# How long after a kernel says it runs a cell its SIGINT handler is surely in place.
HANDLER_DELAY = 0.1
# How long after that an interrupt sent too early is sent again, unless the cell
# ended meanwhile (a second signal while the first one's traceback is being
# written loses the traceback).
RESEND_DELAY = 1.0
# How long node has to take an interrupt from its pipe before it gets SIGINT
# (its event loop is busy with the cell).
SIGNAL_DELAY = 0.2

_out_fd = os.dup(1)
# Whatever a library prints goes to stderr, never into the event stream.
os.dup2(2, 1)
_out_lock = threading.Lock()


def emit(ev):
    data = (json.dumps(ev, separators=(",", ":"), default=str) + "\n").encode()
    with _out_lock:
        view = memoryview(data)
        while view:
            n = os.write(_out_fd, view)
            view = view[n:]


def fatal(name, message):
    emit({"t": "fatal", "name": name, "message": message})
    os._exit(3)


class Cell:
    """The per-cell budget of stream text."""

    def __init__(self):
        self.written = 0
        self.truncated = False

    def stream(self, name, text):
        if self.truncated:
            return
        room = STREAM_CAP - self.written
        if len(text) > room:
            text = text[:room]
            self.truncated = True
        self.written += len(text)
        if text:
            emit({"t": name, "text": text})
        if self.truncated:
            emit({"t": name, "text": TRUNCATED})

    def result(self, main, data):
        size = sum(len(v) if isinstance(v, str) else len(json.dumps(v, default=str)) for v in data.values())
        if size > RESULT_CAP:
            data = {"text/plain": "[result omitted: its representations are %d bytes]" % size}
            self.truncated = True
        emit({"t": "result", "main": main, "data": data})


def describe_exit(code):
    if code is None:
        return {"code": None, "signal": None}
    if code < 0:
        return {"code": None, "signal": -code}
    return {"code": code, "signal": None}


class Tail:
    """Drains a pipe, keeping its last bytes (a dying kernel's last words)."""

    def __init__(self, f, keep=2048):
        self.keep = keep
        self.buf = b""
        t = threading.Thread(target=self._run, args=(f,), daemon=True)
        t.start()

    def _run(self, f):
        while True:
            b = f.read1(65536) if hasattr(f, "read1") else f.read(65536)
            if not b:
                return
            self.buf = (self.buf + b)[-self.keep :]

    def text(self):
        return self.buf.decode("utf-8", "replace")


# Registered in a Python kernel before the first cell: a DataFrame's result also
# carries its data (split orientation), bounded by its cell count.
PY_SETUP = r"""
def __sandlot_setup():
    import os, sys
    try:
        ip = get_ipython()
    except NameError:
        return
    ip.colors = "NoColor"
    try:
        ip.InteractiveTB.set_colors("NoColor")
    except Exception:
        pass
    def frame(df):
        if df.size > 200000:
            return None
        import json
        return json.loads(df.to_json(orient="split", date_format="iso", default_handler=str))
    f = ip.display_formatter.formatters.get("application/json")
    if f is not None:
        f.for_type_by_name("pandas.core.frame", "DataFrame", frame)
    try:
        from IPython.core.formatters import BaseFormatter
        from traitlets import ObjectName, Unicode
    except ImportError:
        return
    ns = {}
    exec(CHART_SOURCE, ns)

    chart_of = ns["chart_of"]

    # Not registered by type: matplotlib's inline backend takes figures away from
    # every formatter but its own when it selects its image formats.
    class ChartFormatter(BaseFormatter):
        format_type = Unicode(CHART_MIME)
        print_method = ObjectName("_repr_sandlot_chart_")
        _return_type = (dict,)

        def __call__(self, obj):
            figure = sys.modules.get("matplotlib.figure")
            if figure is None or not isinstance(obj, figure.Figure):
                return None
            return chart_of(obj)

    ip.display_formatter.formatters[CHART_MIME] = ChartFormatter(parent=ip.display_formatter)
__sandlot_setup()
del __sandlot_setup
"""

# Run in a Python kernel once: from the moment a cell's code starts (the first
# `exec` after IPython's `pre_run_cell`, inside the `try` that turns a
# KeyboardInterrupt into the cell's error), the byte in FLAG_PATH is `1`. An
# interrupt asked before that waits for it: a SIGINT that reaches the kernel
# earlier is ignored (ipykernel ignores SIGINT between cells) or lands in
# IPython's own code, and is lost.
PY_CELL_FLAG = r"""
def __sandlot_cell_flag(path):
    import os, sys
    ip = get_ipython()
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    armed = [False]

    def arm(*_):
        armed[0] = True

    def hook(event, _args):
        if event == "exec" and armed[0]:
            armed[0] = False
            os.pwrite(fd, b"1", 0)

    ip.events.register("pre_run_cell", arm)
    sys.addaudithook(hook)
__sandlot_cell_flag(FLAG_PATH)
del __sandlot_cell_flag
"""

# Run in a Python kernel once: there is no display in a sandbox, so PIL's
# `Image.show()` shows the image as a result of the cell (its desktop viewers
# report nothing shown without writing a file; the IPython viewer after them
# displays it), and with
# SHOW_SAVED an image saved to a path is shown too, as E2B's template does. PIL is
# patched when a cell first imports it (an import hook), so a kernel that never
# uses it never loads it.
PY_IMAGES = r"""
def __sandlot_images(show_saved):
    import sys

    def show(self, image, **options):
        return 0

    def patch_show(m):
        m.UnixViewer.show = show

    def patch_save(m):
        import os
        from IPython.display import display
        original = m.Image.save

        def save(self, fp, format=None, **params):
            original(self, fp, format, **params)
            if isinstance(fp, (str, bytes, os.PathLike)):
                display(self)

        m.Image.save = save

    patches = {"PIL.ImageShow": patch_show}
    if show_saved:
        patches["PIL.Image"] = patch_save
    for name in list(patches):
        if name in sys.modules:
            patches.pop(name)(sys.modules[name])

    class AfterImport:
        def find_spec(self, name, path=None, target=None):
            patch = patches.get(name)
            if patch is None:
                return None
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(name, path, target)
                if spec is not None:
                    break
            else:
                return None
            inner = spec.loader
            if inner is None or not hasattr(inner, "exec_module"):
                return spec
            hook = self

            class Loader:
                def create_module(self, spec):
                    return inner.create_module(spec)

                def exec_module(self, module):
                    inner.exec_module(module)
                    if patches.pop(name, None) is not None:
                        try:
                            patch(module)
                        except Exception:
                            pass
                    if not patches and hook in sys.meta_path:
                        sys.meta_path.remove(hook)

                def __getattr__(self, attr):
                    return getattr(inner, attr)

            spec.loader = Loader()
            return spec

    if patches:
        sys.meta_path.insert(0, AfterImport())
__sandlot_images(SHOW_SAVED)
del __sandlot_images
"""

# The MIME type of a figure's chart data (E2B's `chart`), and its extractor, run
# in the kernel: what a matplotlib figure shows (its type, title, axis labels,
# units, ticks, scales and elements), read from its artists when it is
# displayed. Anything it cannot read makes no chart (never an error).
CHART_MIME = "application/vnd.sandlot.chart+json"
CHART_SOURCE = r"""
import json, math, re

CAP = 1 << 20
UNIT = re.compile(r"\s\((.*?)\)|\[(.*?)\]")


def num(v):
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return f if math.isfinite(f) else None


def point(v, dates):
    iso = getattr(v, "isoformat", None)
    if iso is not None:
        return iso()
    if type(v).__name__ == "datetime64":
        return str(v.astype("datetime64[s]"))
    if dates:
        import matplotlib.dates as md
        f = num(v)
        return md.num2date(f).isoformat() if isinstance(f, float) else f
    return num(v)


def text(t):
    return t if t else None


def unit(label):
    m = UNIT.search(label or "")
    return (m.group(1) or m.group(2)) if m else None


def is_dates(axis):
    get = getattr(axis, "get_converter", None)
    conv = get() if get is not None else getattr(axis, "converter", None)
    return conv is not None and type(conv).__module__ == "matplotlib.dates"


def is_categorical(axis):
    return type(getattr(axis, "units", None)).__name__ == "UnitData"


def scale(ax, axis, name):
    if is_dates(axis):
        return "datetime"
    s = getattr(ax, "get_%sscale" % name)()
    if s != "linear":
        return s
    return "categorical" if is_categorical(axis) else "linear"


def labelled(ax, flip=False):
    x, y = text(ax.get_xlabel()), text(ax.get_ylabel())
    if flip:
        x, y = y, x
    return {"title": text(ax.get_title()), "x_label": x, "y_label": y,
            "x_unit": unit(x), "y_unit": unit(y)}


def ticks(ax, axis, name):
    dates = is_dates(axis)
    values = getattr(ax, "get_%sticks" % name)()
    labels = [t.get_text() for t in getattr(ax, "get_%sticklabels" % name)()]
    return {"%s_ticks" % name: [point(v, dates) for v in values],
            "%s_tick_labels" % name: labels,
            "%s_scale" % name: scale(ax, axis, name)}


def grid_like(line):
    x, y = line.get_xdata(), line.get_ydata()
    return len(x) == 2 and len(y) == 2 and (x[0] == x[1] or y[0] == y[1])


def named(label, prefix, kind):
    if label.startswith(prefix) and label[len(prefix):].isdigit():
        return "%s %s" % (kind, label[len(prefix):])
    return label


def point_chart(ax, kind, elements):
    c = {"type": kind, **labelled(ax)}
    c.update(ticks(ax, ax.xaxis, "x"))
    c.update(ticks(ax, ax.yaxis, "y"))
    c["elements"] = elements
    return c


def line_chart(ax):
    xd, yd = is_dates(ax.xaxis), is_dates(ax.yaxis)
    elements = []
    for line in ax.get_lines():
        if grid_like(line):
            continue
        pts = [[point(x, xd), point(y, yd)] for x, y in zip(line.get_xdata(), line.get_ydata())]
        elements.append({"label": named(line.get_label(), "_child", "Line"), "points": pts})
    return point_chart(ax, "line", elements)


def scatter_chart(ax):
    xd, yd = is_dates(ax.xaxis), is_dates(ax.yaxis)
    elements = []
    for col in ax.collections:
        pts = [[point(x, xd), point(y, yd)] for x, y in col.get_offsets()]
        elements.append({"label": named(col.get_label(), "_child", "Series"), "points": pts})
    return point_chart(ax, "scatter", elements)


def tick_label_at(ax, name, at, width):
    values = getattr(ax, "get_%sticks" % name)()
    labels = [t.get_text() for t in getattr(ax, "get_%sticklabels" % name)()]
    for v, l in zip(values, labels):
        if abs(v - at) <= abs(width) / 2:
            return l
    return str(num(at))


def bar_chart(ax):
    elements = []
    horizontal = False
    for cont in ax.containers:
        bars = [p for p in cont if hasattr(p, "get_height")]
        if not bars:
            continue
        group = named(cont.get_label() or "", "_container", "Group")
        orient = getattr(cont, "orientation", None)
        if orient is None:
            orient = "horizontal" if len({b.get_height() for b in bars}) == 1 and len(bars) > 1 else "vertical"
        horizontal = orient == "horizontal"
        for b in bars:
            if horizontal:
                label = tick_label_at(ax, "y", b.get_y() + b.get_height() / 2, b.get_height())
                value = b.get_width()
            else:
                label = tick_label_at(ax, "x", b.get_x() + b.get_width() / 2, b.get_width())
                value = b.get_height()
            elements.append({"label": label, "group": group, "value": num(value)})
    return {"type": "bar", **labelled(ax, flip=horizontal), "elements": elements}


def sig(v):
    return float("%.8g" % v)


def pie_chart(ax):
    elements = [{"label": w.get_label(), "angle": round(abs(w.theta2 - w.theta1), 4), "radius": num(w.r)}
                for w in ax.patches]
    return {"type": "pie", "title": text(ax.get_title()), "elements": elements}


def box_chart(ax):
    boxes = []
    for p in ax.patches:
        v = p.get_path().vertices
        boxes.append([min(v[:, 0]), max(v[:, 0]), min(v[:, 1]), max(v[:, 1])])
    # Boxes of one width side by side along x: vertical boxes; else horizontal.
    vertical = len({sig(b[1] - b[0]) for b in boxes}) == 1
    if not vertical:
        boxes = [[b[2], b[3], b[0], b[1]] for b in boxes]
    found = [{"min": b[2], "q1": b[2], "median": None, "q3": b[3], "max": b[3], "outliers": []} for b in boxes]
    for line in ax.get_lines():
        x, y = list(map(float, line.get_xdata())), list(map(float, line.get_ydata()))
        if not vertical:
            x, y = y, x
        for b, f in zip(boxes, found):
            if not x or not all(b[0] <= v <= b[1] for v in x):
                continue
            if len(y) == 2 and y[0] == y[1] and b[2] <= y[0] <= b[3] and x[0] != x[1]:
                f["median"] = y[0]
            elif len(y) == 2 and x[0] == x[1]:
                lo, hi = min(y), max(y)
                if sig(hi) == sig(b[2]):
                    f["min"] = lo
                elif sig(lo) == sig(b[3]):
                    f["max"] = hi
            elif line.get_linestyle() in ("None", "", " ", "none"):
                f["outliers"].extend(y)
            break
    name = "x" if vertical else "y"
    elements = []
    for b, f in zip(boxes, found):
        elements.append({"label": tick_label_at(ax, name, (b[0] + b[1]) / 2, b[1] - b[0]),
                         "min": sig(f["min"]), "first_quartile": sig(f["q1"]),
                         "median": sig(f["median"] if f["median"] is not None else (f["q1"] + f["q3"]) / 2),
                         "third_quartile": sig(f["q3"]), "max": sig(f["max"]),
                         "outliers": [sig(o) for o in f["outliers"]]})
    return {"type": "box_and_whisker", **labelled(ax, flip=not vertical), "elements": elements}


def axes_chart(ax):
    from matplotlib.collections import PathCollection
    from matplotlib.patches import PathPatch, Rectangle, Wedge

    lines = [l for l in ax.get_lines() if not grid_like(l)]
    patches, cols = list(ax.patches), list(ax.collections)
    if patches and all(isinstance(p, Wedge) for p in patches) and not lines and not cols:
        return pie_chart(ax)
    if patches and all(isinstance(p, PathPatch) for p in patches) and not cols:
        return box_chart(ax)
    if ax.containers and patches and all(isinstance(p, Rectangle) for p in patches) and not cols and not lines:
        return bar_chart(ax)
    if cols and all(isinstance(c, PathCollection) for c in cols) and not patches and not lines:
        return scatter_chart(ax)
    if ax.get_lines() and not patches and not cols:
        return line_chart(ax)
    return {"type": "unknown", "title": text(ax.get_title()), "elements": []}


def chart_of(fig):
    try:
        axes = fig.get_axes()
        if not any(ax.has_data() for ax in axes):
            return None
        if len(axes) == 1:
            chart = axes_chart(axes[0])
        else:
            sup = getattr(fig, "_suptitle", None)
            chart = {"type": "superchart", "title": text(sup.get_text()) if sup is not None else None,
                     "elements": [axes_chart(ax) for ax in axes]}
        data = json.dumps(chart, allow_nan=False)
        return json.loads(data) if len(data) <= CAP else None
    except Exception:
        return None
"""


# tgkill(2)'s number where it is known; elsewhere signals go to the process.
TGKILL = {"x86_64": 234, "aarch64": 131}.get(os.uname().machine)


def tgkill(tgid, tid, sig):
    """Sends `sig` to thread `tid` of process `tgid`; False if it cannot be done
    here (then the caller signals the process). ProcessLookupError if gone."""
    if TGKILL is None:
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    except (OSError, ImportError):
        return False
    if libc.syscall(TGKILL, tgid, tid, sig) == 0:
        return True
    err = ctypes.get_errno()
    if err == 3:  # ESRCH
        raise ProcessLookupError(tid)
    return False


class Kernel:
    """A Jupyter kernel started from an argv template, spoken to with jupyter_client."""

    def __init__(self, argv_template, cwd, language):
        from jupyter_client.blocking import BlockingKernelClient
        from jupyter_client.connect import write_connection_file

        self.language = language
        self.dir = tempfile.mkdtemp(prefix="sandlot-kernel-")
        cf = os.path.join(self.dir, "kernel.json")
        write_connection_file(cf, transport="ipc", ip=os.path.join(self.dir, "k"))
        argv = [a.replace("{connection_file}", cf) for a in argv_template]
        env = dict(os.environ)
        env["JPY_PARENT_PID"] = str(os.getpid())
        env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
        env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
        # Same process group as this driver: the daemon ends both with one signal.
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            close_fds=True,
        )
        self.tail = Tail(self.proc.stderr)
        kc = BlockingKernelClient(connection_file=cf)
        kc.load_connection_file()
        kc.start_channels()
        self.kc = kc
        self._wait_ready()

    def _wait_ready(self):
        """Waits for the kernel's answer on the shell channel and for IOPub to carry
        its messages: a subscription is set up asynchronously, and a cell run before
        it is would lose its output and its end."""
        import time

        deadline = time.monotonic() + 120
        self.info = None
        while time.monotonic() < deadline:
            msg_id = self.kc.kernel_info()
            seen_iopub = False
            until = time.monotonic() + 1.0
            while time.monotonic() < until and not (self.info is not None and seen_iopub):
                if self.proc.poll() is not None:
                    raise KernelDied(self.proc.returncode, self.tail.text())
                try:
                    m = self.kc.get_shell_msg(timeout=0.02)
                    if m["parent_header"].get("msg_id") == msg_id:
                        self.info = m["content"]
                except queue.Empty:
                    pass
                try:
                    m = self.kc.get_iopub_msg(timeout=0.02)
                    if m["parent_header"].get("msg_id") == msg_id:
                        seen_iopub = True
                except queue.Empty:
                    pass
            if self.info is not None and seen_iopub:
                # Drain the rest of the start-up messages.
                while True:
                    try:
                        self.kc.get_iopub_msg(timeout=0.02)
                    except queue.Empty:
                        return
        raise KernelDied(None, "the kernel did not answer within 120 seconds")

    # The kernel's "its cell's code runs" byte (PY_CELL_FLAG), if it has one.
    flag_fd = None

    def cell_runs(self):
        """True once the cell's code runs, False before; None if the kernel cannot say."""
        if self.flag_fd is None:
            return None
        try:
            return os.pread(self.flag_fd, 1, 0) == b"1"
        except OSError:
            return None

    def interrupt(self):
        self.interrupted = True
        runs = self.cell_runs()
        if runs is not None:
            # One SIGINT, once the cell's code runs (`run` sends a deferred one).
            self.interrupt_pending = not runs
            if runs:
                self._sigint()
            return
        # A kernel that cannot say: sent now and again once the cell surely runs
        # (see `run`) unless it did already: a SIGINT that arrives before the
        # kernel handles the cell is lost, and one too many interrupts the
        # traceback instead. Output of the cell proves its handler is in place:
        # once it came, one signal is enough.
        busy_at = getattr(self, "busy_at", None)
        early = busy_at is None or time.monotonic() - busy_at < HANDLER_DELAY
        self.interrupt_pending = early and not getattr(self, "cell_output", False)
        self._sigint()

    def _sigint(self):
        # To the kernel's main thread, where Python runs the cell: a signal sent to
        # the process may be taken by another of its threads (gVisor does so),
        # which leaves the main thread asleep in the cell's `time.sleep`.
        try:
            if not tgkill(self.proc.pid, self.proc.pid, signal.SIGINT):
                os.kill(self.proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass

    def silent(self, code):
        """Runs `code` without output or history; waits for its reply."""
        msg_id = self.kc.execute(code, silent=True, store_history=False)
        self._reply(msg_id, None)

    def expect_run(self):
        """A run was read (the kernel is idle): an interrupt from now on is for it."""
        if self.flag_fd is not None:
            os.pwrite(self.flag_fd, b"0", 0)
        self.interrupt_pending = False
        self.busy_at = None
        self.cell_output = False
        self.interrupted = False

    def run(self, code, cell):
        import time

        errored = False
        msg_id = self.kc.execute(code, silent=False, store_history=True, allow_stdin=False, stop_on_error=False)
        idle = False
        reply = None
        reply_at = None
        while not idle:
            busy_at = self.busy_at
            if self.interrupt_pending and self.flag_fd is not None:
                if self.cell_runs():
                    self.interrupt_pending = False
                    self._sigint()
            elif self.interrupt_pending and busy_at is not None and time.monotonic() - busy_at >= RESEND_DELAY:
                self.interrupt_pending = False
                self._sigint()
            try:
                m = self.kc.get_iopub_msg(timeout=0.05)
            except queue.Empty:
                if self.proc.poll() is not None:
                    raise KernelDied(self.proc.returncode, self.tail.text())
                if reply is None:
                    reply = self._poll_reply(msg_id)
                    if reply is not None:
                        reply_at = time.monotonic()
                # The reply came but IOPub went quiet: its end was lost, do not wait forever.
                elif time.monotonic() - reply_at > 2.0:
                    break
                continue
            if m["parent_header"].get("msg_id") != msg_id:
                continue
            kind, c = m["msg_type"], m["content"]
            if kind in ("stream", "execute_result", "display_data"):
                self.cell_output = True
            if kind == "stream":
                cell.stream("stdout" if c.get("name") == "stdout" else "stderr", c.get("text", ""))
            elif kind == "execute_result":
                cell.result(True, c.get("data", {}))
            elif kind == "display_data":
                cell.result(False, c.get("data", {}))
            elif kind == "error":
                self.interrupt_pending = False
                errored = True
                emit({"t": "exception", "name": c.get("ename", ""), "value": c.get("evalue", ""),
                      "traceback": "\n".join(c.get("traceback", []))})
            elif kind == "status" and c.get("execution_state") == "busy":
                self.busy_at = time.monotonic()
            elif kind == "status" and c.get("execution_state") == "idle":
                idle = True
        if reply is None:
            reply = self._reply(msg_id, cell, within=5.0)
        if reply is None:
            # The kernel went idle without answering: an interrupt that landed in
            # its own code around the cell (ipykernel logs it and sends nothing).
            reply = {"count": None, "status": "error",
                     "ename": "KeyboardInterrupt" if self.interrupted else "Error",
                     "evalue": "the kernel ended the cell without an answer", "traceback": []}
        if reply["status"] == "error" and not errored:
            # The reply says the cell failed but IOPub carried no error (an
            # interrupt that landed while the kernel sent it): the reply's own fields.
            name = reply.get("ename") or ("KeyboardInterrupt" if self.interrupted else "Error")
            emit({"t": "exception", "name": name, "value": reply.get("evalue") or "",
                  "traceback": "\n".join(reply.get("traceback") or [])})
        return reply

    @staticmethod
    def _reply_of(c):
        out = {"count": c.get("execution_count"), "status": c.get("status", "error")}
        if out["status"] == "error":
            tb = c.get("traceback")
            out.update(ename=str(c.get("ename") or ""), evalue=str(c.get("evalue") or ""),
                       traceback=[str(t) for t in tb] if isinstance(tb, list) else [])
        return out

    def _poll_reply(self, msg_id):
        while True:
            try:
                m = self.kc.get_shell_msg(timeout=0)
            except queue.Empty:
                return None
            if m["parent_header"].get("msg_id") == msg_id:
                return self._reply_of(m["content"])

    def _reply(self, msg_id, cell, within=None):
        """The reply to `msg_id`; None if it did not come `within` seconds."""
        until = None if within is None else time.monotonic() + within
        while True:
            try:
                m = self.kc.get_shell_msg(timeout=0.1)
            except queue.Empty:
                if self.proc.poll() is not None:
                    raise KernelDied(self.proc.returncode, self.tail.text())
                if until is not None and time.monotonic() > until:
                    return None
                continue
            if m["parent_header"].get("msg_id") == msg_id:
                return self._reply_of(m["content"])

    def close(self):
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass


class KernelDied(Exception):
    def __init__(self, code, tail):
        super().__init__("kernel died")
        self.code = code
        self.tail = tail


class Bash:
    """One persistent bash for contexts whose image has no Jupyter bash kernel: each
    cell is sourced from a file (stdin is /dev/null), its end marked on stdout,
    stderr and a status pipe, so every output byte is read before the cell ends."""

    def __init__(self, cwd):
        import secrets

        self.dir = tempfile.mkdtemp(prefix="sandlot-bash-")
        self.token = "__sandlot_end_%s__" % secrets.token_hex(8)
        self.status_r, status_w = os.pipe()
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(status_w,),
            env=dict(os.environ, SANDLOT_STATUS_FD=str(status_w)),
        )
        self.status_w = status_w
        self.count = 0
        self.info = {"implementation": "bash", "language_info": {"name": "bash"}}

    def interrupt(self):
        # The foreground commands of the cell are bash's children.
        _sigint_tree(self.proc.pid, children=True)

    def run(self, code, cell, env=None):
        self.count += 1
        path = os.path.join(self.dir, "cell.sh")
        with open(path, "w") as f:
            f.write(code)
            f.write("\n")
        # The run's variables hold for this cell only: each one's earlier value
        # (or its absence) comes back after it, as with E2B.
        prefix = restore = ""
        for i, (k, v) in enumerate((k, v) for k, v in (env or {}).items() if _sh_name(k)):
            prefix += "__sl_had%d=${%s+x}; __sl_old%d=${%s-}; export %s=%s; " % (i, k, i, k, k, _sh_quote(v))
            restore += ('if [ -n "$__sl_had%d" ]; then export %s="$__sl_old%d"; else unset %s; fi; '
                        "unset __sl_had%d __sl_old%d; " % (i, k, i, k, i, i))
        t = self.token
        # An interrupt (SIGINT to bash and its children) returns from the sourced
        # cell once its foreground command has ended.
        line = ("%strap 'return 130' INT; . %s </dev/null; __s=$?; trap - INT; %s"
                "printf '\\n%s\\n'; printf '\\n%s\\n' >&2; echo $__s >&%d\n"
                % (prefix, _sh_quote(path), restore, t, t, self.status_w))
        try:
            self.proc.stdin.write(line.encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise KernelDied(self.proc.poll(), "")
        q = queue.Queue()
        marker = ("\n" + t + "\n").encode()
        for name, f in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr)):
            threading.Thread(target=_read_until, args=(f, marker, name, q), daemon=True).start()
        ended = 0
        while ended < 2:
            try:
                name, data = q.get(timeout=0.1)
            except queue.Empty:
                if self.proc.poll() is not None:
                    raise KernelDied(self.proc.returncode, "")
                continue
            if data is None:
                ended += 1
                continue
            cell.stream(name, data.decode("utf-8", "replace"))
        status = b""
        while not status.endswith(b"\n"):
            b = os.read(self.status_r, 64)
            if not b:
                raise KernelDied(self.proc.poll(), "")
            status += b
        code = int(status.strip() or b"1")
        if code != 0:
            emit({"t": "exception", "name": "ExitCode", "value": str(code), "traceback": ""})
        return {"count": self.count, "status": "ok" if code == 0 else "error"}

    def close(self):
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass


# The program a javascript context without a Jupyter kernel runs in `node -e`
# (argv: the events pipe's fd, the requests pipe's fd, the end marker). It
# speaks JSON lines: requests `{"op": "run", "id", "count", "code", "env"}` and
# `{"op": "interrupt"}` in, events out, each with the id of the cell it belongs
# to: `stdout`, `stderr`, `result` (util.inspect of the last expression's
# value), `exception`, `done`. Only node's own modules: no npm package.
NODE_SOURCE = r"""
// Everything in one function: the cells run in this realm's global scope, and
// nothing of the driver's may be visible there.
(() => {
  'use strict';
  const fs = require('fs');
  const repl = require('repl');
  const util = require('util');
  const { PassThrough } = require('stream');
  const { StringDecoder } = require('string_decoder');
  const net = require('net');

  const [eventsArg, requestsArg, token] = process.argv.slice(-3);
  process.argv.splice(1);
  // The pipes to the driver, opened again close-on-exec: a process a cell
  // starts has neither.
  function own(fd, flags) {
    try {
      const mine = fs.openSync(`/proc/self/fd/${fd}`, flags);
      fs.closeSync(fd);
      return mine;
    } catch (e) {
      return fd;
    }
  }
  const events = own(Number(eventsArg), 'w');
  const requestsFd = own(Number(requestsArg), 'r');

  function send(ev) {
    const data = Buffer.from(JSON.stringify(ev) + '\n');
    let off = 0;
    while (off < data.length) {
      try {
        off += fs.writeSync(events, data, off);
      } catch (e) {
        if (e.code !== 'EAGAIN') throw e;
      }
    }
  }

  // The cell running now (null between cells); what it writes is its output.
  let current = null;

  // process.stdout and process.stderr (console.*, their write()) become the cell's
  // stream events, in the order written, on the one events pipe: a cell's
  // output is all read before its end. Children writing to fds 1 and 2 go
  // through the real pipes, closed by a marker per cell.
  for (const [name, stream] of [['stdout', process.stdout], ['stderr', process.stderr]]) {
    const decoder = new StringDecoder('utf8');
    stream.write = function (chunk, encoding, cb) {
      if (typeof encoding === 'function') {
        cb = encoding;
        encoding = undefined;
      }
      const text = typeof chunk === 'string'
        ? (encoding && encoding !== 'utf8' && encoding !== 'utf-8' ? Buffer.from(chunk, encoding).toString() : chunk)
        : decoder.write(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength));
      if (text) send({ t: name, id: current ? current.id : null, text });
      if (typeof cb === 'function') process.nextTick(cb);
      return true;
    };
  }

  // Node's REPL evaluator: top-level await, and declarations (let, const, class,
  // function) that stay for the next cell. Its domain is a stand-in: errors
  // come to the callback instead of being printed, and uncaught errors of
  // callbacks a cell left behind reach the process's handlers below.
  const noDomain = { bind: (f) => f, on() {}, once() {}, emit() {}, add() {}, remove() {}, enter() {}, exit() {} };
  const server = repl.start({
    input: new PassThrough(),
    output: new PassThrough(),
    prompt: '',
    terminal: false,
    useGlobal: true,
    useColors: false,
    breakEvalOnSigint: true,
    domain: noDomain,
  });
  server.removeAllListeners('SIGINT');

  // Static imports at the start of a line become `await import()` bindings
  // (`var`, so that running the cell again works); line numbers stay.
  const ATTRIBUTES = String.raw`(?:\s*(?:with|assert)\s*(\{[^}]*\}))?[ \t]*;?`;
  const IMPORT = new RegExp(
    String.raw`^([ \t]*)import\s+(?:([\w$]+)\s*(?:,\s*)?)?` + // the default binding
      String.raw`(?:\*\s*as\s+([\w$]+)|\{([^}]*)\})?` + // a namespace, or named bindings
      String.raw`\s*from\s*(['"][^'"\n]+['"])` + ATTRIBUTES,
    'gm',
  );
  const BARE = new RegExp(String.raw`^([ \t]*)import\s*(['"][^'"\n]+['"])` + ATTRIBUTES, 'gm');
  function rewriteImports(code) {
    return code
      .replace(IMPORT, (all, indent, def, ns, named, spec, attrs) => {
        if (!def && !ns && named === undefined) return all;
        const source = attrs ? `await import(${spec}, { with: ${attrs} })` : `await import(${spec})`;
        if (ns) {
          return `${indent}var ${ns} = ${source};` + (def ? ` var ${def} = ${ns}.default;` : '');
        }
        const fields = [];
        if (def) fields.push(`default: ${def}`);
        if (named !== undefined && named.trim()) {
          fields.push(named.replace(/((?:[\w$]+|'[^']*'|"[^"]*"))\s+as\s+([\w$]+)/g, '$1: $2').replace(/,\s*$/, ''));
        }
        return `${indent}var { ${fields.join(', ')} } = ${source};`;
      })
      .replace(BARE, (all, indent, spec, attrs) =>
        `${indent}void (${attrs ? `await import(${spec}, { with: ${attrs} })` : `await import(${spec})`});`);
  }

  // The frames below the cell's own are the evaluator's and this driver's.
  const MACHINERY = new RegExp(
    String.raw`^\s+at (?:sigintHandlersWrap|ContextifyScript\.|Script\.|makeContextifyScript|REPLServer\.` +
      String.raw`|.*\((?:node:vm|node:repl|node:internal\/vm)[:)])`,
  );
  function traceback(err) {
    if (!(err instanceof Error) && !(err && typeof err.stack === 'string')) return 'Uncaught ' + util.inspect(err);
    const lines = String(err.stack).split('\n');
    const cut = lines.findIndex((l) => MACHINERY.test(l));
    return (cut < 0 ? lines : lines.slice(0, cut)).join('\n');
  }

  function describe(err) {
    if (err instanceof repl.Recoverable) err = err.err;
    if (err && err.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED') {
      return { name: 'KeyboardInterrupt', value: 'the cell was interrupted', traceback: '' };
    }
    if (err !== null && typeof err === 'object' && typeof err.name === 'string') {
      return { name: err.name, value: String(err.message === undefined ? '' : err.message), traceback: traceback(err) };
    }
    const value = typeof err === 'string' ? err : util.inspect(err);
    return { name: 'Error', value, traceback: 'Uncaught ' + util.inspect(err) };
  }

  function finish(cell, err, result) {
    if (cell.done) return;
    cell.done = true;
    // The run's variables held for this cell only.
    for (const [k, v] of cell.saved) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
    if (err !== null && err !== undefined) {
      send({ t: 'exception', id: cell.id, ...describe(err) });
    } else if (result !== undefined) {
      let text;
      try {
        text = util.inspect(result);
      } catch (e) {
        text = '[the value could not be shown: ' + describe(e).value + ']';
      }
      send({ t: 'result', id: cell.id, text });
    }
    current = null;
    // Closes what children of the cell wrote to the real fds 1 and 2.
    fs.writeSync(1, `\n${token}\n`);
    fs.writeSync(2, `\n${token}\n`);
    send({ t: 'done', id: cell.id, status: err !== null && err !== undefined ? 'error' : 'ok' });
  }

  // An interrupt ends the cell now; its promises, if it awaits, are left
  // to themselves. Between cells it does nothing.
  function interrupt() {
    if (current !== null) {
      const e = new Error('interrupted');
      e.code = 'ERR_SCRIPT_EXECUTION_INTERRUPTED';
      finish(current, e);
    }
  }
  // The driver asks on the requests pipe first; a cell that keeps the event
  // loop busy gets SIGINT instead: the evaluator's watchdog stops it while it
  // runs synchronously, and this handler takes it otherwise.
  const onSigint = interrupt;
  process.on('SIGINT', onSigint);
  // While the evaluator runs a cell its own watchdog takes SIGINT. With a
  // SIGINT listener in place vm would also take the listeners away for the run,
  // and that resets SIGINT to its default over the watchdog's handler: the
  // signal would end the process. So vm sees none.
  let evaluating = false;
  const listenerCount = process.listenerCount;
  process.listenerCount = function (name, ...rest) {
    return evaluating && name === 'SIGINT' ? 0 : listenerCount.call(this, name, ...rest);
  };
  function run(req) {
    const cell = { id: req.id, done: false, saved: new Map() };
    current = cell;
    for (const [k, v] of Object.entries(req.env || {})) {
      cell.saved.set(k, process.env[k]);
      process.env[k] = String(v);
    }
    let code;
    try {
      code = rewriteImports(String(req.code));
    } catch (e) {
      code = String(req.code);
    }
    evaluating = true;
    try {
      server.eval(code + '\n', server.context, `cell${req.count}`, (err, result) => {
        // What the cell's callbacks and promises write right after it (its
        // unhandled rejections too) is still its output.
        setImmediate(() => finish(cell, err, result));
      });
    } catch (e) {
      finish(cell, e);
    } finally {
      evaluating = false;
      // The evaluator's SIGINT watchdog leaves SIGINT fatal when it stops; the
      // handler below is put back in place.
      process.removeListener('SIGINT', onSigint);
      process.on('SIGINT', onSigint);
    }
  }

  // What callbacks left behind by a cell throw is written to stderr, and the
  // interpreter goes on.
  process.on('uncaughtException', (err) => {
    process.stderr.write('Uncaught ' + (err && err.stack ? traceback(err) : util.inspect(err)) + '\n');
  });
  process.on('unhandledRejection', (err) => {
    process.stderr.write('Uncaught (in promise) ' + (err && err.stack ? traceback(err) : util.inspect(err)) + '\n');
  });

  const requests = new net.Socket({ fd: requestsFd, readable: true, writable: false });
  let pending = '';
  requests.setEncoding('utf8');
  requests.on('data', (chunk) => {
    pending += chunk;
    let i;
    while ((i = pending.indexOf('\n')) >= 0) {
      const line = pending.slice(0, i);
      pending = pending.slice(i + 1);
      let req;
      try {
        req = JSON.parse(line);
      } catch (e) {
        continue;
      }
      if (req.op === 'run') run(req);
      else if (req.op === 'interrupt') interrupt();
    }
  });
  // The driver is gone.
  requests.on('end', () => process.exit(0));
  requests.on('error', () => process.exit(0));
  send({ t: 'ready', version: process.version });
})();
"""


class Node:
    """One persistent node for javascript contexts whose image has no Jupyter
    JavaScript kernel: NODE_SOURCE evaluates each cell with node's REPL evaluator
    in one realm, so declarations, imports and `await` behave as in node's REPL.
    What the cell writes through process.stdout and process.stderr comes on the
    events pipe, in order, before the cell's end; what its children write to the
    real stdout and stderr is read up to the cell's end marker, as with Bash."""

    def __init__(self, cwd, node):
        import secrets

        self.token = "__sandlot_end_%s__" % secrets.token_hex(8)
        events_r, events_w = os.pipe()
        requests_r, self.requests = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [node, "-e", NODE_SOURCE, str(events_w), str(requests_r), self.token],
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(events_w, requests_r),
            )
        finally:
            os.close(events_w)
            os.close(requests_r)
        # Events and the output of the real pipes, in the order read.
        self.q = queue.Queue()
        threading.Thread(target=self._read_events, args=(events_r,), daemon=True).start()
        self.count = 0
        # Orders the writes to node, and guards `expecting` and `interrupted_at`.
        self.lock = threading.Lock()
        # A run was read and has not ended; when an interrupt for it was asked.
        self.expecting = False
        self.interrupted_at = None
        self.info = {"implementation": "node", "language_info": {"name": "javascript"}}
        deadline = time.monotonic() + 60
        while True:
            try:
                kind, ev = self.q.get(timeout=0.1)
            except queue.Empty:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self._fail_start()
                continue
            if ev is None:
                self._fail_start()
            if ev.get("t") == "ready":
                self.info["implementation_version"] = str(ev.get("version", ""))
                return

    def _fail_start(self):
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise KernelDied(None, "node did not start within 60 seconds") from None
        raise KernelDied(self.proc.returncode, self.proc.stderr.read1(4096).decode("utf-8", "replace"))

    def _read_events(self, fd):
        with os.fdopen(fd, "rb") as f:
            for line in f:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if isinstance(ev, dict):
                    self.q.put(("event", ev))
        self.q.put(("event", None))

    def expect_run(self):
        """A run was read: an interrupt from now on is for it."""
        with self.lock:
            self.expecting = True
            self.interrupted_at = None

    def interrupt(self):
        # Asked on the requests pipe, after the run's request: node takes it once
        # the cell leaves the event loop free (it awaits), or once it ended (then
        # it does nothing). A cell that keeps the loop busy gets SIGINT from
        # `run`. SIGINT is never the first resort: node's evaluator leaves it
        # fatal for a moment after each synchronous run.
        with self.lock:
            # One request per run: a later interrupt of the same run adds
            # nothing (the SIGINTs of `run` follow the first), and a flood of
            # them must not fill the pipe and stall this driver on its lock.
            if not self.expecting or self.interrupted_at is not None:
                return
            self.interrupted_at = time.monotonic()
            try:
                self._write(b'{"op":"interrupt"}\n')
            except OSError:
                pass

    def _write(self, data):
        while data:
            data = data[os.write(self.requests, data):]

    def _sigint(self, children):
        # With `children`, node's descendants too: a cell blocked in `execSync`
        # or `spawnSync` waits in native code for its child, which must end
        # first (as Bash's do). Only on the second SIGINT, so a server an
        # earlier cell spawned is spared when node alone can stop the cell.
        _sigint_tree(self.proc.pid, children)

    def run(self, code, cell, env=None):
        self.count += 1
        cid = self.count
        env = {str(k): str(v) for k, v in (env or {}).items()}
        req = json.dumps({"op": "run", "id": cid, "count": cid, "code": code, "env": env}) + "\n"
        try:
            with self.lock:
                self._write(req.encode())
        except BrokenPipeError:
            raise KernelDied(self.proc.wait(), "") from None
        marker = ("\n" + self.token + "\n").encode()
        for name, f in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr)):
            threading.Thread(target=_read_until, args=(f, marker, name, self.q), daemon=True).start()
        ended = 0
        done = None
        # SIGINTs sent for an interrupt node did not take from the pipe: one after
        # SIGNAL_DELAY, and one more a second later (the first may have come while
        # node still compiled the cell, before its evaluator watched for it).
        signals = 0
        while done is None or ended < 2:
            # Checked on every turn: a busy cell may write all the time.
            with self.lock:
                asked = self.interrupted_at
            if done is None and asked is not None and signals < 2:
                if time.monotonic() - asked >= SIGNAL_DELAY + signals * RESEND_DELAY:
                    signals += 1
                    self._sigint(children=signals == 2)
            try:
                kind, item = self.q.get(timeout=0.05)
            except queue.Empty:
                if self.proc.poll() is not None:
                    raise KernelDied(self.proc.returncode, "") from None
                continue
            if kind != "event":
                if item is None:
                    ended += 1
                else:
                    cell.stream(kind, item.decode("utf-8", "replace"))
                continue
            if item is None:
                # The events pipe closed: node is gone.
                try:
                    code = self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    code = None
                raise KernelDied(code, "")
            if item.get("id") != cid:
                continue
            t = item.get("t")
            if t in ("stdout", "stderr"):
                cell.stream(t, str(item.get("text", "")))
            elif t == "result":
                cell.result(True, {"text/plain": str(item.get("text", ""))})
            elif t == "exception":
                emit({"t": "exception", "name": str(item.get("name", "")), "value": str(item.get("value", "")),
                      "traceback": str(item.get("traceback", ""))})
            elif t == "done":
                done = item
                with self.lock:
                    self.expecting = False
        return {"count": cid, "status": "ok" if done.get("status") == "ok" else "error"}

    def close(self):
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass


def _read_until(f, marker, name, q):
    buf = b""
    while True:
        b = f.read1(65536)
        if not b:
            q.put((name, None))
            return
        buf += b
        i = buf.find(marker)
        if i >= 0:
            if buf[:i]:
                q.put((name, buf[:i]))
            q.put((name, None))
            return
        # Keep back what could be the start of the marker.
        keep = len(marker) - 1
        if len(buf) > keep:
            q.put((name, buf[:-keep]))
            buf = buf[-keep:]


def _sigint_tree(pid, children):
    """SIGINT to `pid` and, with `children`, to its descendants."""
    for p in [pid] + (_children(pid) if children else []):
        try:
            os.kill(p, signal.SIGINT)
        except ProcessLookupError:
            pass


def _children(pid):
    out = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    parents = {pid}
    found = True
    while found:
        found = False
        for n in names:
            if not n.isdigit() or int(n) in out:
                continue
            try:
                with open("/proc/%s/stat" % n) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid in parents:
                out.append(int(n))
                parents.add(int(n))
                found = True
    return out


def _sh_quote(s):
    return "'" + s.replace("'", "'\\''") + "'"


def _sh_name(k):
    return k.replace("_", "a").isalnum() and not k[0].isdigit()


def start(language, cwd, show_saved_images=False):
    import importlib.util

    if language == "python":
        for pkg, deb in (("jupyter_client", "python3-jupyter-client"), ("ipykernel", "python3-ipykernel")):
            if importlib.util.find_spec(pkg) is None:
                fatal("MissingPackage", "python contexts need the Python package %s (Debian: %s), "
                      "which this sandbox's python3 does not have" % (pkg, deb))
        # `-P` (Python 3.11+): the working directory is not searched for the
        # kernel's own modules while it starts (a `zmq.py` there is not run);
        # ipykernel puts it on the path for the cells afterwards, as Jupyter does.
        safe_path = ["-P"] if sys.version_info >= (3, 11) else []
        argv = [sys.executable] + safe_path + ["-m", "ipykernel_launcher", "-f", "{connection_file}",
                "--HistoryManager.enabled=False", "--InteractiveShell.colors=NoColor",
                "--IPKernelApp.quiet=True"]
        k = Kernel(argv, cwd, "python")
        # One round trip for both set-ups.
        k.silent(PY_SETUP.replace("CHART_SOURCE", repr(CHART_SOURCE)).replace("CHART_MIME", repr(CHART_MIME))
                 + PY_IMAGES.replace("SHOW_SAVED", repr(show_saved_images)))
        flag = os.path.join(k.dir, "cell-runs")
        fd = os.open(flag, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        os.pwrite(fd, b"0", 0)
        k.silent(PY_CELL_FLAG.replace("FLAG_PATH", repr(flag)))
        k.flag_fd = fd
        return k
    spec = None
    if importlib.util.find_spec("jupyter_client") is not None:
        from jupyter_client.kernelspec import KernelSpecManager

        ksm = KernelSpecManager()
        for name in sorted(ksm.find_kernel_specs()):
            try:
                s = ksm.get_kernel_spec(name)
            except Exception:
                continue
            if s.language.lower() == language:
                spec = s
                break
    if spec is not None:
        return Kernel(spec.argv, cwd, language)
    if language == "bash":
        return Bash(cwd)
    if language == "javascript":
        import shutil

        node = shutil.which("node") or shutil.which("nodejs")
        if node is not None:
            return Node(cwd, node)
        fatal("MissingKernel", "no Jupyter kernel for javascript is installed in this sandbox, and no node "
              "either: javascript contexts need Node.js 16 or later (Debian: nodejs) or a Jupyter "
              "JavaScript kernel (e.g. ijavascript, or deno's jupyter kernel)")
    fatal("MissingKernel", "no Jupyter kernel for %s is installed in this sandbox" % language)


# Every process a context's kernel starts inherits this variable (the context's
# id): what an earlier driver of the context left behind is found by it, even
# processes that left the kernel's process group and session.
CONTEXT_VAR = "SANDLOT_CODE_CONTEXT"


def sweep(context):
    """Ends the processes an earlier driver of this context left behind."""
    entry = ("%s=%s" % (CONTEXT_VAR, context)).encode()
    me = os.getpid()
    for _ in range(5):
        found = False
        for n in os.listdir("/proc"):
            if not n.isdigit() or int(n) == me:
                continue
            try:
                with open("/proc/%s/environ" % n, "rb") as f:
                    env = f.read()
            except OSError:
                continue
            if entry in env.split(b"\0"):
                try:
                    os.kill(int(n), signal.SIGKILL)
                    found = True
                except OSError:
                    pass
        if not found:
            return
        time.sleep(0.05)


def main():
    conf = json.loads(sys.stdin.buffer.readline())
    language = conf.get("language", "python")
    context = conf.get("context")
    if isinstance(context, str) and context:
        sweep(context)
        os.environ[CONTEXT_VAR] = context
    cwd = os.getcwd()
    requests = queue.Queue()
    try:
        kernel = start(language, cwd, conf.get("show_saved_images") is True)
    except KernelDied as e:
        emit({"t": "died", **describe_exit(e.code), "detail": e.tail[-1024:]})
        os._exit(4)
    info = getattr(kernel, "info", {}) or {}
    emit({"t": "ready", "implementation": str(info.get("implementation", ""))[:100]})

    def read_requests():
        for line in sys.stdin.buffer:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("op") == "interrupt":
                kernel.interrupt()
            else:
                if r.get("op") == "run" and hasattr(kernel, "expect_run"):
                    kernel.expect_run()
                requests.put(r)
        requests.put(None)

    threading.Thread(target=read_requests, daemon=True).start()
    while True:
        r = requests.get()
        if r is None:
            break
        if r.get("op") != "run":
            continue
        cell = Cell()
        try:
            env = r.get("env") or {}
            if isinstance(kernel, (Bash, Node)):
                done = kernel.run(r.get("code", ""), cell, env)
            else:
                if env and language == "python":
                    kernel.silent(
                        "import os as __o\n__o._sandlot_saved = {k: __o.environ.get(k) for k in %s}\n"
                        "__o.environ.update(%s)\ndel __o" % (json.dumps(list(env)), json.dumps(env)))
                done = kernel.run(r.get("code", ""), cell)
                if env and language == "python":
                    kernel.silent(
                        "import os as __o\nfor __k, __v in __o.__dict__.pop('_sandlot_saved', {}).items():\n"
                        "    __o.environ.pop(__k, None) if __v is None else __o.environ.__setitem__(__k, __v)\n"
                        "del __o")
        except KernelDied as e:
            emit({"t": "died", **describe_exit(e.code), "detail": e.tail[-1024:]})
            kernel.close()
            os._exit(0)
        emit({"t": "done", "count": done.get("count"), "status": done.get("status"), "truncated": cell.truncated})
    kernel.close()


main()
