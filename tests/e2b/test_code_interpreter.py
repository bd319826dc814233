"""The official `e2b-code-interpreter` SDK (pinned in scripts/setup.d/60-e2b.sh)
against Sandlot's E2B front door: state across runs, contexts, streaming
callbacks, rich results (display data, a PNG chart and its chart data, a
DataFrame's data), the working directory, per-run variables, a timeout that
stops the cell, a client leaving that stops only its own run, bash, javascript
run by node, and async.
Needs python3 with ipykernel, matplotlib and pandas, and node, on the host."""

import base64
import struct
import threading
import time

import pytest
from e2b import TimeoutException


@pytest.fixture
def ci(server):
    from e2b_code_interpreter import Sandbox

    sb = Sandbox.create(timeout=120)
    try:
        yield sb
    finally:
        sb.kill()


def test_state_is_kept_between_runs(ci):
    assert ci.run_code("x = 1; x += 1; x").text == "2"
    ex = ci.run_code("x + 40")
    assert ex.text == "42" and ex.error is None
    assert ex.execution_count == 2


def test_an_exception_has_its_name_value_and_traceback(ci):
    ex = ci.run_code("def f():\n    raise ValueError('nope')\nf()")
    assert ex.error is not None
    assert (ex.error.name, ex.error.value) == ("ValueError", "nope")
    assert "raise ValueError" in ex.error.traceback


def test_callbacks_stream_output_in_order(ci):
    seen = []
    ex = ci.run_code(
        "import sys, time\nprint('a')\ntime.sleep(0.1)\nprint('b', file=sys.stderr)\n7",
        on_stdout=lambda m: seen.append(("out", m.line)),
        on_stderr=lambda m: seen.append(("err", m.line)),
        on_result=lambda r: seen.append(("result", r.text)),
    )
    assert seen == [("out", "a\n"), ("err", "b\n"), ("result", "7")]
    assert (ex.logs.stdout, ex.logs.stderr) == (["a\n"], ["b\n"])


def test_display_data_and_a_chart_come_as_rich_results(ci):
    ex = ci.run_code(
        "from IPython.display import display, Markdown\n"
        "display(Markdown('**bold**'))\n"
        "%config InlineBackend.print_figure_kwargs = {'bbox_inches': None}\n"
        "import matplotlib.pyplot as plt\n"
        "plt.figure(figsize=(2, 1), dpi=100)\nplt.plot([1, 2, 3])\nplt.show()"
    )
    assert ex.error is None, ex.error
    assert ex.results[0].markdown == "**bold**"
    png = base64.b64decode(ex.results[1].png)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (200, 100)
    assert "png" in ex.results[1].formats()


def test_a_line_chart_carries_its_data(ci):
    from e2b_code_interpreter.charts import ChartType, LineChart

    ex = ci.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.figure()\n"
        "plt.plot([1, 2, 3], [2, 4, 3], label='growth')\n"
        "plt.plot([1, 2, 3], [1, 1, 2])\n"
        "plt.title('Growth')\nplt.xlabel('Time (s)')\nplt.ylabel('Size [m]')\n"
        "plt.show()"
    )
    assert ex.error is None, ex.error
    r = ex.results[0]
    assert {"png", "chart"} <= set(r.formats())
    chart = r.chart
    assert isinstance(chart, LineChart) and chart.type == ChartType.LINE
    assert (chart.title, chart.x_label, chart.y_label) == ("Growth", "Time (s)", "Size [m]")
    assert (chart.x_unit, chart.y_unit) == ("s", "m")
    assert (chart.x_scale, chart.y_scale) == ("linear", "linear")
    assert chart.x_ticks and all(isinstance(t, float) for t in chart.x_ticks)
    assert len(chart.x_tick_labels) == len(chart.x_ticks)
    growth, other = chart.elements
    assert growth.label == "growth"
    assert growth.points == [(1.0, 2.0), (2.0, 4.0), (3.0, 3.0)]
    assert other.label.startswith("Line ") and other.points[2] == (3.0, 2.0)


def test_a_bar_chart_carries_its_data(ci):
    from e2b_code_interpreter.charts import BarChart, ChartType

    ex = ci.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.figure()\n"
        "plt.bar(['Ann', 'Bob', 'Cy'], [3, 5, 2], label='Books')\n"
        "plt.title('Sales')\nplt.xlabel('Author')\nplt.ylabel('Sold')\n"
        "plt.show()"
    )
    assert ex.error is None, ex.error
    chart = ex.results[0].chart
    assert isinstance(chart, BarChart) and chart.type == ChartType.BAR
    assert (chart.title, chart.x_label, chart.y_label) == ("Sales", "Author", "Sold")
    assert [(b.label, b.value, b.group) for b in chart.elements] == [
        ("Ann", 3, "Books"),
        ("Bob", 5, "Books"),
        ("Cy", 2, "Books"),
    ]


def test_a_dataframe_carries_its_html_and_data(ci):
    ex = ci.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3.5, 4.5]})")
    r = ex.results[0]
    assert r.is_main_result and "<table" in r.html
    # As E2B's server gives it: each column's values (pandas' orient="list").
    assert r.data == {"a": [1, 2], "b": [3.5, 4.5]}


def test_contexts_keep_their_own_state_and_cwd(ci):
    a = ci.create_code_context(cwd="/tmp")
    b = ci.create_code_context()
    assert a.cwd == "/tmp" and a.language == "python" and b.cwd == "/home/user"
    ci.run_code("v = 'a'", context=a)
    ci.run_code("v = 'b'", context=b)
    assert ci.run_code("import os\n(v, os.getcwd())", context=a).text == "('a', '/tmp')"
    # A string's text comes without its quotes, as E2B's server answers it.
    assert ci.run_code("v", context=b).text == "b"
    assert {c.id for c in ci.list_code_contexts()} >= {a.id, b.id}
    ci.restart_code_context(b)
    assert ci.run_code("'v' in globals()", context=b).text == "False"
    ci.remove_code_context(a)
    assert a.id not in {c.id for c in ci.list_code_contexts()}


def test_default_contexts_are_listed_from_the_start_and_new_ones_after_them(ci):
    import os

    listed = ci.list_code_contexts()
    languages = [c.language for c in listed]
    # Python's default always; JavaScript's where the sandbox has Node (the
    # `host` image is this machine's /usr).
    has_node = any(os.path.exists(p) for p in ("/usr/local/bin/node", "/usr/bin/node"))
    assert languages == (["python", "javascript"] if has_node else ["python"])
    assert all(c.cwd == "/home/user" for c in listed)
    # The listed default is the context a run without one uses.
    python = listed[0]
    ci.run_code("seen = 7")
    assert ci.run_code("seen", context=python).text == "7"
    made = ci.create_code_context()
    after = ci.list_code_contexts()
    assert [c.id for c in after].count(python.id) == 1
    assert after[0].id == python.id and after[-1].id == made.id
    # A listed default not made yet may be restarted or removed, as with E2B.
    if has_node:
        ci.restart_code_context(listed[1])
        ci.remove_code_context(listed[1])


def test_cells_run_as_root_and_a_context_may_work_in_root_home(ci):
    # As in E2B, whose Jupyter server runs as root: cells may install packages
    # or write anywhere in the sandbox; the default directory stays the user's.
    assert ci.run_code("import os\n(os.getuid(), os.getcwd())").text == "(0, '/home/user')"
    ctx = ci.create_code_context(cwd="/root")
    assert ctx.cwd == "/root"
    ex = ci.run_code("open('here', 'w').write('x')\nimport os\nos.path.abspath('here')", context=ctx)
    assert ex.error is None, ex.error
    assert ex.text == "/root/here"
    # Commands keep running as the sandbox's user.
    assert ci.commands.run("id -u").stdout.strip() == "1000"


def test_an_image_shown_or_saved_by_pil_comes_as_a_png_result(ci):
    make = (
        "import numpy\nfrom PIL import Image\n"
        "image = Image.fromarray((numpy.random.rand(16, 24, 3) * 255).astype('uint8'))\n"
    )
    ex = ci.run_code(make + "image.show()\nprint('shown')")
    assert ex.error is None, ex.error
    assert ex.logs.stdout == ["shown\n"]
    assert len(ex.results) == 1
    png = base64.b64decode(ex.results[0].png)
    assert struct.unpack(">II", png[16:24]) == (24, 16)
    ex = ci.run_code("image.save('/tmp/saved.png')\nimage.save('/tmp/saved.jpg', 'JPEG')")
    assert ex.error is None, ex.error
    assert [bool(r.png) for r in ex.results] == [True, True]
    assert ci.files.read("/tmp/saved.png", format="bytes")[:8] == b"\x89PNG\r\n\x1a\n"
    # Saving to a file object is not showing.
    ex = ci.run_code("import io\nimage.save(io.BytesIO(), 'PNG')")
    assert ex.error is None and ex.results == []


def test_a_run_its_sandbox_is_killed_during_raises_that_it_was_killed(server):
    from e2b_code_interpreter import Sandbox

    sb = Sandbox.create(timeout=120)
    try:
        # Killed once the cell runs; the answer is cut, as behind E2B's proxy,
        # never a complete execution.
        with pytest.raises(TimeoutException, match="killed while the request was in progress"):
            sb.run_code(
                "import time\nprint('running', flush=True)\ntime.sleep(60)",
                timeout=90,
                on_stdout=lambda _: threading.Thread(target=sb.kill).start(),
            )
    finally:
        sb.kill()


def test_env_vars_are_set_for_one_run(ci):
    assert ci.run_code("import os\nos.getenv('FOO')", envs={"FOO": "bar"}).text == "bar"
    assert ci.run_code("os.getenv('FOO')").text is None


def test_a_timeout_stops_the_cell_and_the_context_goes_on(ci):
    ci.run_code("kept = 5")
    started = time.monotonic()
    with pytest.raises(TimeoutException):
        ci.run_code("import time\ntime.sleep(30)", timeout=2)
    # The server interrupted the cell when the client left: the next run does
    # not wait for it, and the state is still there.
    assert ci.run_code("kept").text == "5"
    assert time.monotonic() - started < 20


def test_a_client_leaving_stops_only_its_own_run(ci, server):
    import httpx

    ctx = ci.create_code_context()
    # The first caller's cell runs until a file appears.
    first = []
    cell = (
        "import os, time\nopen('/tmp/first-runs', 'w').close()\n"
        "while not os.path.exists('/tmp/go'):\n    time.sleep(0.05)\n6 * 7"
    )
    t = threading.Thread(target=lambda: first.append(ci.run_code(cell, context=ctx, timeout=120)))
    t.start()
    deadline = time.monotonic() + 60
    while not ci.files.exists("/tmp/first-runs"):
        assert time.monotonic() < deadline, "the first cell did not start"
        time.sleep(0.1)
    # A second caller waits for the same context, then leaves.
    headers = {
        "E2b-Sandbox-Id": ci.sandbox_id,
        "E2b-Sandbox-Port": "49999",
        "E2B-Traffic-Access-Token": ci.traffic_access_token,
    }
    body = {"code": "open('/tmp/second-ran', 'w').close()", "context_id": ctx.id}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/execute", headers=headers, json=body, timeout=1.0)
    # Time for the server to see the second caller gone (it interrupted the
    # first caller's cell then).
    time.sleep(2)
    ci.files.write("/tmp/go", "")
    t.join(120)
    ex = first[0]
    assert ex.error is None, ex.error
    assert ex.text == "42"
    # The abandoned run never ran.
    assert ci.run_code("import os\nos.path.exists('/tmp/second-ran')", context=ctx).text == "False"


def test_bash_keeps_its_shell_state(ci):
    ci.run_code("cd /tmp && N=3", language="bash")
    ex = ci.run_code("echo $N $PWD", language="bash")
    assert ex.logs.stdout == ["3 /tmp\n"]
    # A run's variables hold for that run only: the shell's own come back after.
    ci.run_code("export KEEP=mine", language="bash")
    ex = ci.run_code('echo "$KEEP $ONCE"', language="bash", envs={"KEEP": "run", "ONCE": "x y"})
    assert ex.logs.stdout == ["run x y\n"]
    ex = ci.run_code('echo "$KEEP ${ONCE-unset}"', language="bash")
    assert ex.logs.stdout == ["mine unset\n"]


def test_javascript_keeps_state_and_runs_await_imports_errors_and_run_env_in_node(ci):
    # The host image has node and no Jupyter JavaScript kernel. `js` is javascript.
    ci.run_code("let n = 40\nfunction add(a, b) { return a + b }", language="javascript")
    ex = ci.run_code("add(n, 2)", language="js")
    assert (ex.text, ex.error) == ("42", None)
    assert ci.run_code("await Promise.resolve('Hello World!')", language="js").text == "Hello World!"
    ex = ci.run_code("import { readFileSync } from 'fs'\nconsole.log(typeof readFileSync)", language="js")
    assert ex.logs.stdout == ["function\n"]
    ex = ci.run_code("missing()", language="js")
    assert ex.error is not None
    assert (ex.error.name, ex.error.value) == ("ReferenceError", "missing is not defined")
    assert ex.error.traceback.startswith("ReferenceError: missing is not defined")
    assert ci.run_code("process.env.FOO", envs={"FOO": "bar"}, language="js").text == "bar"
    assert ci.run_code("process.env.FOO || 'default'", language="js").text == "default"
    # The client leaving interrupts the busy loop; the state stays.
    with pytest.raises(TimeoutException):
        ci.run_code("while (true) {}", language="js", timeout=2)
    assert ci.run_code("n", language="js").text == "40"


def test_an_unknown_language_is_refused_by_name(ci):
    from e2b import SandboxException

    with pytest.raises(SandboxException) as e:
        ci.run_code("1", language="cobol")
    assert "cobol" in str(e.value)


@pytest.mark.asyncio
async def test_async_run_code(server):
    from e2b_code_interpreter import AsyncSandbox

    sb = await AsyncSandbox.create(timeout=120)
    try:
        out = []

        async def on_stdout(m):
            out.append(m.line)

        await sb.run_code("y = 20")
        ex = await sb.run_code("print('hi')\ny * 2 + 2", on_stdout=on_stdout)
        assert (ex.text, out) == ("42", ["hi\n"])
    finally:
        await sb.kill()


def test_the_code_interpreter_needs_a_token_of_its_sandbox(ci, server):
    import httpx

    url = server.url + "/execute"
    base = {"E2b-Sandbox-Id": ci.sandbox_id, "E2b-Sandbox-Port": "49999"}
    assert httpx.post(url, headers=base, json={"code": "1"}).status_code == 401
    wrong = {**base, "E2B-Traffic-Access-Token": "0" * 64}
    assert httpx.post(url, headers=wrong, json={"code": "1"}).status_code == 401
    right = {**base, "E2B-Traffic-Access-Token": ci.traffic_access_token}
    # The first run starts the context's kernel: seconds on gVisor under load, past
    # httpx's default of 5 s.
    r = httpx.post(url, headers=right, json={"code": "6 * 7"}, timeout=120)
    assert r.status_code == 200 and '"text":"42"' in r.text.replace(" ", "")


def test_a_code_request_body_is_read_only_for_a_caller_with_a_token_and_is_bounded(ci, server):
    import httpx

    url = server.url + "/execute"
    base = {"E2b-Sandbox-Id": ci.sandbox_id, "E2b-Sandbox-Port": "49999"}
    huge = b'{"code": "' + b"x" * (2 << 20) + b'"}'
    # Refused before the body is read: no token, no reading it.
    assert httpx.post(url, headers=base, content=huge).status_code == 401
    right = {**base, "E2B-Traffic-Access-Token": ci.traffic_access_token}
    # With the token: no more than the operator's request body limit (1M).
    assert httpx.post(url, headers=right, content=huge).status_code == 413
    assert httpx.post(server.url + "/contexts", headers=right, content=huge).status_code == 413
