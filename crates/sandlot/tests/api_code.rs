//! Code contexts through the API: state across runs, rich results (a PNG of the
//! asked size, a DataFrame's data), streaming order, interrupt, timeouts, kernel
//! crashes and restarts, the output cap, concurrent contexts and their clean-up,
//! the WebSocket form, the CLI, warm pools with running kernels, and javascript
//! contexts run by node.
//! Needs python3 with ipykernel, matplotlib and pandas, and node (16 or later,
//! without a Jupyter JavaScript kernel) on the host (`host` image).

mod api_support;

use std::collections::BTreeMap;
use std::time::Duration;

use api_support::{block_on_within, eventually, spec_body, Daemon};
use base64::Engine;
use sandlot_client::code::{
    CodeEvent, CreateContextBody, Execution, RunCodeBody, RunStatus, DEFAULT_CONTEXT,
};
use sandlot_client::{Client, CreateSandbox};
use serde_json::json;

fn cell(code: &str) -> RunCodeBody {
    RunCodeBody {
        code: code.into(),
        ..Default::default()
    }
}

async fn run(c: &Client, id: &str, ctx: &str, code: &str) -> Execution {
    c.run_code(id, ctx, &cell(code)).await.unwrap()
}

/// The `text/plain` of the run's main result.
fn value(x: &Execution) -> String {
    let main = x
        .results
        .iter()
        .find(|r| r.is_main_result)
        .unwrap_or_else(|| panic!("no main result: {x:?}"));
    main.data["text/plain"].as_str().unwrap().to_string()
}

/// Width and height from a PNG's IHDR chunk.
fn png_size(png: &[u8]) -> (u32, u32) {
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    assert_eq!(&png[12..16], b"IHDR");
    let be = |b: &[u8]| u32::from_be_bytes(b.try_into().unwrap());
    (be(&png[16..20]), be(&png[20..24]))
}

/// How many ipykernel processes run in the sandbox.
async fn kernels(c: &Client, id: &str) -> usize {
    let out = c
        .run(
            id,
            &[
                "sh",
                "-c",
                "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f 2>/dev/null; echo; done",
            ],
        )
        .await
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("ipykernel_launcher"))
        .count()
}

#[test]
fn a_context_keeps_state_and_returns_rich_results() {
    let d = Daemon::start(None);
    let c = d.client();
    block_on_within(180, "rich results", async {
        let sb = c.create_sandbox(&CreateSandbox::default()).await.unwrap();
        let id = sb.id.as_str();
        // The default context: variables, imports and the working directory stay.
        let x = run(
            &c,
            id,
            DEFAULT_CONTEXT,
            "import os\nx = 41\nos.chdir('/tmp')\nprint('hi')",
        )
        .await;
        assert_eq!(
            (x.status, x.stdout.concat()),
            (RunStatus::Ok, "hi\n".into())
        );
        assert!(!x.restarted);
        let x = run(&c, id, DEFAULT_CONTEXT, "x + 1").await;
        assert_eq!(value(&x), "42");
        let x = run(&c, id, DEFAULT_CONTEXT, "os.getcwd()").await;
        assert_eq!(value(&x), "'/tmp'");
        assert_eq!(x.execution_count, Some(3));
        // An exception: name, value and a traceback naming the line.
        let x = run(&c, id, DEFAULT_CONTEXT, "def f():\n    return 1/0\nf()").await;
        assert_eq!(x.status, RunStatus::Error);
        let e = x.error.unwrap();
        assert_eq!(
            (e.name.as_str(), e.value.as_str()),
            ("ZeroDivisionError", "division by zero")
        );
        assert!(e.traceback.contains("return 1/0"), "{}", e.traceback);
        assert!(
            !e.traceback.contains('\u{1b}'),
            "colour codes in {}",
            e.traceback
        );
        // A matplotlib figure of 4x3 inches at 50 dpi is a 200x150 PNG.
        let x = run(
            &c,
            id,
            DEFAULT_CONTEXT,
            "%config InlineBackend.print_figure_kwargs = {'bbox_inches': None}\n\
             import matplotlib.pyplot as plt\n\
             fig = plt.figure(figsize=(4, 3), dpi=50)\nplt.plot([1, 3, 2])\nplt.show()",
        )
        .await;
        assert_eq!(x.status, RunStatus::Ok, "{x:?}");
        let shown: Vec<_> = x.results.iter().filter(|r| !r.is_main_result).collect();
        assert_eq!(shown.len(), 1, "{x:?}");
        let png = base64::engine::general_purpose::STANDARD
            .decode(shown[0].data["image/png"].as_str().unwrap().trim())
            .unwrap();
        assert_eq!(png_size(&png), (200, 150));
        // Its chart data comes with it.
        let chart = &shown[0].data["application/vnd.sandlot.chart+json"];
        assert_eq!(chart["type"], "line", "{chart}");
        assert_eq!(
            chart["elements"][0]["points"],
            json!([[0.0, 1.0], [1.0, 3.0], [2.0, 2.0]])
        );
        // A DataFrame: HTML and its data.
        let x = run(
            &c,
            id,
            DEFAULT_CONTEXT,
            "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})\ndf",
        )
        .await;
        let main = x.results.iter().find(|r| r.is_main_result).unwrap();
        assert!(main.data["text/html"].as_str().unwrap().contains("<table"));
        assert_eq!(
            main.data["application/json"],
            json!({"columns": ["a", "b"], "index": [0, 1], "data": [[1, "x"], [2, "y"]]})
        );
        // display() output comes before the main result, in order; Markdown too.
        let x = run(
            &c,
            id,
            DEFAULT_CONTEXT,
            "from IPython.display import display, Markdown\ndisplay(Markdown('# hi'))\n'last'",
        )
        .await;
        assert_eq!(x.results.len(), 2);
        assert_eq!(x.results[0].data["text/markdown"], json!("# hi"));
        assert_eq!(value(&x), "'last'");
        // Per-run variables are there for that run only.
        let mut with_env = cell("os.environ.get('ANSWER')");
        with_env.env = BTreeMap::from([("ANSWER".to_string(), "42".to_string())]);
        let x = c.run_code(id, DEFAULT_CONTEXT, &with_env).await.unwrap();
        assert_eq!(value(&x), "'42'");
        let x = run(&c, id, DEFAULT_CONTEXT, "os.environ.get('ANSWER')").await;
        assert!(x.results.iter().all(|r| !r.is_main_result), "{x:?}");
        c.delete_sandbox(id).await.unwrap();
    });
}

#[test]
fn a_stream_comes_in_order_and_interrupts_and_timeouts_stop_cells() {
    let d = Daemon::start(None);
    let c = d.client();
    block_on_within(180, "streams", async {
        let sb = c.create_sandbox(&CreateSandbox::default()).await.unwrap();
        let id = sb.id.as_str();
        let ctx = c
            .create_context(id, &CreateContextBody::default())
            .await
            .unwrap();
        assert_eq!(
            (ctx.language.as_str(), ctx.state.as_str()),
            ("python", "idle")
        );
        let kinds = streamed(
            &c,
            id,
            &ctx.id,
            "import sys, time\nprint('a')\ntime.sleep(0.2)\nprint('b', file=sys.stderr)\n7",
        )
        .await;
        assert_eq!(
            kinds,
            [
                "started",
                "stdout:a\n",
                "stderr:b\n",
                "result:\"7\"",
                "end:Ok"
            ]
        );
        // Interrupt: the cell ends with KeyboardInterrupt, the state stays.
        run(&c, id, &ctx.id, "kept = 'yes'").await;
        let mut s = c
            .run_code_stream(
                id,
                &ctx.id,
                &cell("print('sleeping', flush=True)\ntime.sleep(60)"),
            )
            .await
            .unwrap();
        assert!(matches!(
            s.next_event().await.unwrap(),
            Some(CodeEvent::Started { .. })
        ));
        assert!(matches!(
            s.next_event().await.unwrap(),
            Some(CodeEvent::Stdout { .. })
        ));
        assert_eq!(c.list_contexts(id).await.unwrap()[0].state, "busy");
        c.interrupt_context(id, &ctx.id).await.unwrap();
        let mut end = None;
        while let Some(ev) = s.next_event().await.unwrap() {
            if let CodeEvent::End { status, error, .. } = ev {
                end = Some((status, error.unwrap().name));
            }
        }
        assert_eq!(end, Some((RunStatus::Error, "KeyboardInterrupt".into())));
        assert_eq!(value(&run(&c, id, &ctx.id, "kept").await), "'yes'");
        // The same over a WebSocket, the interrupt sent in band.
        let mut ws = c
            .run_code_ws(
                id,
                &ctx.id,
                &cell("print('ws', flush=True)\ntime.sleep(60)"),
            )
            .await
            .unwrap();
        assert!(matches!(
            ws.next_event().await.unwrap(),
            Some(CodeEvent::Started { .. })
        ));
        assert_eq!(
            ws.next_event().await.unwrap(),
            Some(CodeEvent::Stdout {
                text: "ws\n".into()
            })
        );
        ws.interrupt().await.unwrap();
        let mut end = None;
        while let Some(ev) = ws.next_event().await.unwrap() {
            if let CodeEvent::End { status, error, .. } = ev {
                end = Some((status, error.unwrap().name));
            }
        }
        assert_eq!(end, Some((RunStatus::Error, "KeyboardInterrupt".into())));
        // A timeout interrupts a cell: it ends as timed out, the state stays.
        let mut t = cell("time.sleep(60)");
        t.timeout = Some(json!(1));
        let x = c.run_code(id, &ctx.id, &t).await.unwrap();
        assert_eq!(x.status, RunStatus::TimedOut);
        assert_eq!(x.error.unwrap().name, "TimeoutError");
        let x = run(&c, id, &ctx.id, "kept").await;
        assert_eq!((value(&x), x.restarted), ("'yes'".into(), false));
        // A cell that ignores the interrupt: the interpreter is ended, and the next
        // run says its state is lost.
        let mut t =
            cell("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)");
        t.timeout = Some(json!("1s"));
        let x = c.run_code(id, &ctx.id, &t).await.unwrap();
        assert_eq!(x.status, RunStatus::TimedOut);
        assert!(x.error.unwrap().value.contains("state is lost"));
        let x = run(&c, id, &ctx.id, "'kept' in globals()").await;
        assert_eq!((value(&x), x.restarted), ("False".into(), true));
        assert_eq!(c.list_contexts(id).await.unwrap()[0].restarts, 1);
        c.delete_sandbox(id).await.unwrap();
    });
}

#[test]
fn a_kernel_crash_is_named_and_the_next_run_restarts_it() {
    let d = Daemon::start(None);
    let c = d.client();
    block_on_within(240, "crashes", async {
        let sb = c
            .create_sandbox(&spec_body(json!({"resources": {"memory": "384M"}})))
            .await
            .unwrap();
        let id = sb.id.as_str();
        let other = c
            .create_context(id, &CreateContextBody::default())
            .await
            .unwrap();
        run(&c, id, &other.id, "survivor = 1").await;
        for (code, expect) in [
            ("import os\nos._exit(3)", "exit code 3"),
            ("import ctypes\nctypes.string_at(0)", "signal 11"),
            ("b = b'x' * (1 << 30)", "out of memory"),
        ] {
            run(&c, id, DEFAULT_CONTEXT, "state = 1").await;
            let x = run(&c, id, DEFAULT_CONTEXT, code).await;
            assert_eq!(x.status, RunStatus::Crashed, "{code}: {x:?}");
            let e = x.error.unwrap();
            assert_eq!(e.name, "KernelDied");
            assert!(e.value.contains(expect), "{code}: {}", e.value);
            let x = run(&c, id, DEFAULT_CONTEXT, "'state' in globals()").await;
            assert_eq!((value(&x), x.restarted), ("False".into(), true), "{code}");
        }
        // The other context and the sandbox are untouched.
        assert_eq!(value(&run(&c, id, &other.id, "survivor").await), "1");
        assert_eq!(c.run(id, &["true"]).await.unwrap().exit.code, Some(0));
        c.delete_sandbox(id).await.unwrap();
    });
}

#[test]
fn a_cell_printing_too_much_is_cut_with_a_marker() {
    let d = Daemon::start(None);
    let c = d.client();
    block_on_within(180, "output cap", async {
        let sb = c.create_sandbox(&CreateSandbox::default()).await.unwrap();
        let id = sb.id.as_str();
        let x = run(
            &c,
            id,
            DEFAULT_CONTEXT,
            "import sys\nfor _ in range(40):\n    sys.stdout.write('x' * (1 << 20))\nprint('after')\n'done'",
        )
        .await;
        assert_eq!(x.status, RunStatus::Ok);
        assert!(x.truncated);
        let out = x.stdout.concat();
        assert!(out.len() <= (8 << 20) + 100, "{} bytes kept", out.len());
        assert!(out.ends_with("[output truncated: the cell wrote more than 8 MiB]\n"));
        assert!(!out.contains("after"));
        assert_eq!(value(&x), "'done'");
        // The next run starts clean.
        let x = run(&c, id, DEFAULT_CONTEXT, "print('small')").await;
        assert_eq!((x.stdout.concat(), x.truncated), ("small\n".into(), false));
        c.delete_sandbox(id).await.unwrap();
    });
}

#[test]
fn contexts_run_concurrently_apart_and_end_when_deleted() {
    let d = Daemon::start(None);
    let c = d.client();
    block_on_within(180, "contexts", async {
        let sb = c.create_sandbox(&CreateSandbox::default()).await.unwrap();
        let id = sb.id.as_str();
        let a = c
            .create_context(id, &CreateContextBody::default())
            .await
            .unwrap();
        let b = c
            .create_context(
                id,
                &CreateContextBody {
                    cwd: Some("/tmp".into()),
                    env: BTreeMap::from([("WHO".to_string(), "b".to_string())]),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        // Two contexts run at once: a's cell waits for a file that b's cell writes
        // (run one after the other, a's would time out).
        let wait =
            "import os, time\nwhile not os.path.exists('/tmp/b-ran'):\n    time.sleep(0.01)\n\
                    v = 'a'\n(v, os.getcwd(), os.environ.get('WHO'))";
        let write = "import os\nopen('/tmp/b-ran', 'w').close()\nv = 'b'\n(v, os.getcwd(), os.environ.get('WHO'))";
        let mut in_a = cell(wait);
        in_a.timeout = Some(json!(30));
        let (xa, xb) = tokio::join!(c.run_code(id, &a.id, &in_a), async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            run(&c, id, &b.id, write).await
        });
        let xa = xa.unwrap();
        assert_eq!(xa.status, RunStatus::Ok, "{xa:?}");
        assert_eq!(value(&xa), "('a', '/root', None)");
        assert_eq!(value(&xb), "('b', '/tmp', 'b')");
        assert_eq!(c.list_contexts(id).await.unwrap().len(), 2);
        // A bash context keeps its shell's state.
        let sh = c
            .create_context(
                id,
                &CreateContextBody {
                    language: Some("bash".into()),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        run(&c, id, &sh.id, "cd /tmp && N=5").await;
        let x = run(&c, id, &sh.id, "echo $N $PWD; echo oops >&2").await;
        assert_eq!(
            (x.stdout.concat(), x.stderr.concat()),
            ("5 /tmp\n".into(), "oops\n".into())
        );
        let x = run(&c, id, &sh.id, "false").await;
        assert_eq!(x.status, RunStatus::Error);
        // Deleting ends the kernels.
        assert_eq!(kernels(&c, id).await, 2);
        // The answer comes once the kernel is gone.
        c.delete_context(id, &a.id).await.unwrap();
        assert_eq!(kernels(&c, id).await, 1);
        let e = c.run_code(id, &a.id, &cell("1")).await.unwrap_err();
        assert_eq!(e.code(), Some("not_found"));
        assert!(e.to_string().contains(&a.id), "{e}");
        assert_eq!(value(&run(&c, id, &b.id, "v").await), "'b'");
        c.delete_sandbox(id).await.unwrap();
    });
}

fn javascript() -> CreateContextBody {
    CreateContextBody {
        language: Some("javascript".into()),
        ..Default::default()
    }
}

/// The events of a streamed run, each as `kind:text`.
async fn streamed(c: &Client, id: &str, ctx: &str, code: &str) -> Vec<String> {
    let mut s = c.run_code_stream(id, ctx, &cell(code)).await.unwrap();
    let mut kinds = Vec::new();
    while let Some(ev) = s.next_event().await.unwrap() {
        kinds.push(match ev {
            CodeEvent::Started { .. } => "started".to_string(),
            CodeEvent::Stdout { text } => format!("stdout:{text}"),
            CodeEvent::Stderr { text } => format!("stderr:{text}"),
            CodeEvent::Result { result } => format!("result:{}", result.data["text/plain"]),
            CodeEvent::End { status, .. } => format!("end:{status:?}"),
            other => format!("{other:?}"),
        });
    }
    kinds
}

#[test]
fn a_javascript_context_keeps_declarations_and_runs_await_imports_output_errors_and_run_env() {
    let d = Daemon::start(None);
    let c = d.client();
    block_on_within(180, "javascript", async {
        let sb = c.create_sandbox(&CreateSandbox::default()).await.unwrap();
        let id = sb.id.as_str();
        // The host image has node and no Jupyter JavaScript kernel.
        let js = c.create_context(id, &javascript()).await.unwrap();
        assert_eq!(js.language, "javascript");
        // let, const, function and class declared in one cell are there in the next.
        let x = run(
            &c,
            id,
            &js.id,
            "let n = 40\nconst two = 2\nfunction add(a, b) { return a + b }\n\
             class Box { constructor(v) { this.v = v } }",
        )
        .await;
        assert_eq!((x.status, x.results.len()), (RunStatus::Ok, 0), "{x:?}");
        let x = run(&c, id, &js.id, "add(n, two) + new Box(0).v").await;
        assert_eq!((value(&x), x.execution_count), ("42".into(), Some(2)));
        assert_eq!(value(&run(&c, id, &js.id, "n += 1").await), "41");
        // Top-level await: its value is the result, its declaration stays.
        let x = run(
            &c,
            id,
            &js.id,
            "const greeting = await Promise.resolve('Hello World!')\ngreeting",
        )
        .await;
        assert_eq!(value(&x), "'Hello World!'");
        assert_eq!(value(&run(&c, id, &js.id, "greeting.length").await), "12");
        // Static imports (indented too), and require.
        let x = run(
            &c,
            id,
            &js.id,
            "import { readFileSync } from 'fs'\nimport fs from 'fs'\n  import * as path from 'path'\n\
             console.log(typeof readFileSync, typeof fs.existsSync, path.join('a', 'b'))",
        )
        .await;
        assert_eq!(
            (x.stdout.concat(), x.results.len()),
            ("function function a/b\n".into(), 0)
        );
        let x = run(
            &c,
            id,
            &js.id,
            "require('os').platform() + ' ' + path.basename('/x/y.txt')",
        )
        .await;
        assert_eq!(value(&x), "'linux y.txt'");
        // Output comes in the order written, before the result.
        let kinds = streamed(
            &c,
            id,
            &js.id,
            "console.log('a')\nconsole.error('b')\nprocess.stdout.write('c\\n')\n6 * 7",
        )
        .await;
        assert_eq!(
            kinds,
            [
                "started",
                "stdout:a\n",
                "stderr:b\n",
                "stdout:c\n",
                "result:\"42\"",
                "end:Ok"
            ]
        );
        // What a child writes to the real stdout and stderr is the cell's too.
        let x = run(
            &c,
            id,
            &js.id,
            "require('child_process').execSync('echo child; echo oops >&2', { stdio: 'inherit' })",
        )
        .await;
        assert_eq!(
            (x.stdout.concat(), x.stderr.concat()),
            ("child\n".into(), "oops\n".into())
        );
        // An uncaught exception: its name, message and stack; the state stays.
        let x = run(
            &c,
            id,
            &js.id,
            "function boom() { return missing + 1 }\nboom()",
        )
        .await;
        assert_eq!(x.status, RunStatus::Error);
        let e = x.error.unwrap();
        assert_eq!(
            (e.name.as_str(), e.value.as_str()),
            ("ReferenceError", "missing is not defined")
        );
        assert!(
            e.traceback
                .starts_with("ReferenceError: missing is not defined\n")
                && e.traceback.contains("at boom"),
            "{}",
            e.traceback
        );
        let x = run(
            &c,
            id,
            &js.id,
            "await Promise.reject(new TypeError('no way'))",
        )
        .await;
        let e = x.error.unwrap();
        assert_eq!((e.name.as_str(), e.value.as_str()), ("TypeError", "no way"));
        assert_eq!(value(&run(&c, id, &js.id, "n").await), "41");
        // A run's variables hold for that run only (its children see them too):
        // each one's earlier value, or its absence, comes back after it.
        run(&c, id, &js.id, "process.env.KEEP = 'mine'").await;
        let mut once = cell(
            "[process.env.KEEP, process.env.ONCE, \
             require('child_process').execSync('echo $ONCE').toString()]",
        );
        once.env = BTreeMap::from([
            ("KEEP".to_string(), "run".to_string()),
            ("ONCE".to_string(), "x y".to_string()),
        ]);
        let x = c.run_code(id, &js.id, &once).await.unwrap();
        assert_eq!(value(&x), "[ 'run', 'x y', 'x y\\n' ]");
        let x = run(&c, id, &js.id, "[process.env.KEEP, 'ONCE' in process.env]").await;
        assert_eq!(value(&x), "[ 'mine', false ]");
        c.delete_sandbox(id).await.unwrap();
    });
}

#[test]
fn a_javascript_interrupt_stops_a_busy_loop_or_an_await_keeping_state_and_an_exit_loses_it() {
    let d = Daemon::start(None);
    let c = d.client();
    block_on_within(180, "javascript interrupts", async {
        let sb = c.create_sandbox(&CreateSandbox::default()).await.unwrap();
        let id = sb.id.as_str();
        let js = c.create_context(id, &javascript()).await.unwrap();
        run(&c, id, &js.id, "let kept = 'yes'").await;
        for code in [
            "console.log('spinning')\nwhile (true) {}",
            "console.log('waiting')\nawait new Promise(() => {})",
        ] {
            // A timeout bounds the test if the interrupt does nothing.
            let mut busy = cell(code);
            busy.timeout = Some(json!(30));
            let mut s = c.run_code_stream(id, &js.id, &busy).await.unwrap();
            assert!(matches!(
                s.next_event().await.unwrap(),
                Some(CodeEvent::Started { .. })
            ));
            assert!(matches!(
                s.next_event().await.unwrap(),
                Some(CodeEvent::Stdout { .. })
            ));
            c.interrupt_context(id, &js.id).await.unwrap();
            let mut end = None;
            while let Some(ev) = s.next_event().await.unwrap() {
                if let CodeEvent::End { status, error, .. } = ev {
                    end = Some((status, error.unwrap().name));
                }
            }
            assert_eq!(
                end,
                Some((RunStatus::Error, "KeyboardInterrupt".into())),
                "{code}"
            );
            let x = run(&c, id, &js.id, "kept").await;
            assert_eq!((value(&x), x.restarted), ("'yes'".into(), false), "{code}");
        }
        // An interrupt of the run sent before its cell runs stops it once it does.
        let mut busy = cell("while (true) {}");
        busy.timeout = Some(json!(30));
        let mut ws = c.run_code_ws(id, &js.id, &busy).await.unwrap();
        assert!(matches!(
            ws.next_event().await.unwrap(),
            Some(CodeEvent::Started { .. })
        ));
        ws.interrupt().await.unwrap();
        let mut end = None;
        while let Some(ev) = ws.next_event().await.unwrap() {
            if let CodeEvent::End { status, error, .. } = ev {
                end = Some((status, error.unwrap().name));
            }
        }
        assert_eq!(end, Some((RunStatus::Error, "KeyboardInterrupt".into())));
        assert_eq!(value(&run(&c, id, &js.id, "kept").await), "'yes'");
        // A cell that ends node: the interpreter died, the next run starts a new
        // one without the state.
        let x = run(&c, id, &js.id, "process.exit(3)").await;
        assert_eq!(x.status, RunStatus::Crashed, "{x:?}");
        let e = x.error.unwrap();
        assert_eq!(e.name, "KernelDied");
        assert!(e.value.contains("exit code 3"), "{}", e.value);
        let x = run(&c, id, &js.id, "typeof kept").await;
        assert_eq!((value(&x), x.restarted), ("'undefined'".into(), true));
        c.delete_sandbox(id).await.unwrap();
    });
}

#[test]
fn unknown_languages_and_missing_kernels_are_refused_by_name() {
    let d = Daemon::start(None);
    let c = d.client();
    block_on_within(120, "refusals", async {
        let sb = c.create_sandbox(&CreateSandbox::default()).await.unwrap();
        let id = sb.id.as_str();
        let lang = |l: &str| CreateContextBody {
            language: Some(l.into()),
            ..Default::default()
        };
        let e = c.create_context(id, &lang("cobol")).await.unwrap_err();
        assert_eq!(e.code(), Some("bad_request"));
        assert!(e.to_string().contains("\"cobol\""), "{e}");
        // javascript with neither a Jupyter kernel nor node (a PATH that finds
        // python3 only) names both.
        c.run(
            id,
            &[
                "sh",
                "-c",
                "mkdir -p /tmp/nonode && ln -sf \"$(command -v python3)\" /tmp/nonode/python3",
            ],
        )
        .await
        .unwrap();
        let e = c
            .create_context(
                id,
                &CreateContextBody {
                    env: BTreeMap::from([("PATH".to_string(), "/tmp/nonode".to_string())]),
                    ..lang("javascript")
                },
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some("kernel_unavailable"));
        let msg = e.to_string();
        assert!(
            msg.contains("no Jupyter kernel for javascript") && msg.contains("Node.js"),
            "{e}"
        );
        // A python3 without ipykernel (hidden from it here) is named.
        c.run(
            id,
            &[
                "sh",
                "-c",
                "mkdir -p /tmp/hide && echo \"import sys; sys.modules['ipykernel'] = None\" > /tmp/hide/sitecustomize.py",
            ],
        )
        .await
        .unwrap();
        let e = c
            .create_context(
                id,
                &CreateContextBody {
                    env: BTreeMap::from([("PYTHONPATH".to_string(), "/tmp/hide".to_string())]),
                    ..Default::default()
                },
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some("kernel_unavailable"));
        assert!(e.to_string().contains("python3-ipykernel"), "{e}");
        assert!(c.list_contexts(id).await.unwrap().is_empty());
        let e = c.run_code(id, "ctx_nope", &cell("1")).await.unwrap_err();
        assert_eq!(e.code(), Some("not_found"));
        assert!(e.to_string().contains("ctx_nope"), "{e}");
        c.delete_sandbox(id).await.unwrap();
    });
}

#[test]
fn run_code_on_the_command_line_streams_output_and_exits_with_the_outcome() {
    let d = Daemon::start(None);
    let c = d.client();
    let id = block_on_within(60, "create", async {
        c.create_sandbox(&CreateSandbox::default())
            .await
            .unwrap()
            .id
    });
    assert_eq!(
        d.cli(&["run-code", &id, "x = 6\nprint('six')\nx * 7"]),
        (0, "six\n42\n".into(), String::new())
    );
    // The state is the default context's; a script comes on stdin with `-`.
    let out = std::process::Command::new(api_support::sandlot())
        .args(["run-code", &id, "-"])
        .env("SANDLOT_URL", format!("unix://{}", d.socket.display()))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut p| {
            use std::io::Write;
            p.stdin.take().unwrap().write_all(b"print(x + 1)\n")?;
            p.wait_with_output()
        })
        .unwrap();
    assert_eq!(
        (out.status.code(), out.stdout.as_slice()),
        (Some(0), &b"7\n"[..])
    );
    let (code, _, err) = d.cli(&["run-code", &id, "x / 0"]);
    assert_eq!(code, 1);
    assert!(err.contains("ZeroDivisionError"), "{err}");
    let (code, _, err) = d.cli(&[
        "run-code",
        "--timeout",
        "1",
        &id,
        "import time\ntime.sleep(30)",
    ]);
    assert_eq!(code, 124);
    assert!(err.contains("TimeoutError"), "{err}");
    block_on_within(30, "delete", async { c.delete_sandbox(&id).await.unwrap() });
}

/// The value of a metric line `name{pool="pool"} V`.
async fn pool_metric(c: &Client, name: &str, pool: &str) -> Option<u64> {
    let text = c.metrics().await.ok()?;
    let key = format!("{name}{{pool=\"{pool}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn a_pool_with_code_contexts_hands_out_sandboxes_whose_kernel_already_runs() {
    let d = Daemon::start(Some(
        "[[pools]]\nname = \"code\"\nsize = 1\ncode_context = true\n",
    ));
    let c = d.client();
    block_on_within(120, "pooled contexts", async {
        let ready = || async { pool_metric(&c, "sandlot_pool_ready", "code").await == Some(1) };
        eventually(60, "the pool to hold a sandbox", ready).await;
        let sb = c.create_sandbox(&CreateSandbox::default()).await.unwrap();
        let id = sb.id.as_str();
        assert_eq!(
            pool_metric(&c, "sandlot_pool_hits_total", "code").await,
            Some(1)
        );
        // Its default context was started before the claim, and is idle.
        let ctxs = c.list_contexts(id).await.unwrap();
        assert_eq!(ctxs.len(), 1, "{ctxs:?}");
        assert_eq!(
            (ctxs[0].id.as_str(), ctxs[0].state.as_str()),
            (DEFAULT_CONTEXT, "idle")
        );
        assert!(
            ctxs[0].created_at < sb.created_at,
            "{} !< {}",
            ctxs[0].created_at,
            sb.created_at
        );
        let x = run(&c, id, DEFAULT_CONTEXT, "1 + 1").await;
        assert_eq!(
            (value(&x), x.restarted, x.execution_count),
            ("2".into(), false, Some(1))
        );
        // A claim with its own environment does not get the pool's kernel: the next
        // run starts one that sees the request's variables.
        eventually(60, "the pool to refill", ready).await;
        let sb2 = c
            .create_sandbox(&spec_body(json!({"env": {"WHO": "claimer"}})))
            .await
            .unwrap();
        assert_eq!(
            pool_metric(&c, "sandlot_pool_hits_total", "code").await,
            Some(2)
        );
        assert!(c.list_contexts(&sb2.id).await.unwrap().is_empty());
        let x = run(&c, &sb2.id, DEFAULT_CONTEXT, "import os\nos.environ['WHO']").await;
        assert_eq!(value(&x), "'claimer'");
        c.delete_sandbox(id).await.unwrap();
        c.delete_sandbox(&sb2.id).await.unwrap();
    });
}

#[test]
fn a_daemon_restart_ends_the_kernels_of_the_contexts_it_forgot() {
    let mut d = Daemon::start(None);
    let c = d.client();
    let id = block_on_within(120, "a context before the restart", async {
        let sb = c.create_sandbox(&CreateSandbox::default()).await.unwrap();
        run(&c, &sb.id, DEFAULT_CONTEXT, "x = 1").await;
        assert_eq!(kernels(&c, &sb.id).await, 1);
        sb.id
    });
    // The daemon dies; the sandbox, its driver and kernel do not.
    d.kill9();
    d.spawn();
    let c = d.client();
    block_on_within(120, "after the restart", async {
        eventually(30, "the forgotten kernel to end", || async {
            kernels(&c, &id).await == 0
        })
        .await;
        // The default context starts afresh.
        let x = run(&c, &id, DEFAULT_CONTEXT, "'x' in globals()").await;
        assert_eq!(value(&x), "False");
        assert_eq!(kernels(&c, &id).await, 1);
        c.delete_sandbox(&id).await.unwrap();
    });
}

/// How many processes in the sandbox run `sleep SECONDS`.
async fn sleeping(c: &Client, id: &str, seconds: &str) -> usize {
    let out = c
        .run(
            id,
            &[
                "sh",
                "-c",
                "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f 2>/dev/null; echo; done",
            ],
        )
        .await
        .unwrap();
    let want = format!("sleep {seconds} ");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with(&want))
        .count()
}

#[test]
fn a_restarted_context_ends_the_processes_its_kernel_left_behind() {
    let d = Daemon::start(None);
    let c = d.client();
    block_on_within(180, "left-behind processes", async {
        let sb = c.create_sandbox(&CreateSandbox::default()).await.unwrap();
        let id = sb.id.as_str();
        let ctx = c
            .create_context(id, &CreateContextBody::default())
            .await
            .unwrap()
            .id;
        let other = c
            .create_context(id, &CreateContextBody::default())
            .await
            .unwrap()
            .id;
        // Processes that leave the kernel's process group and session (one
        // double-forked, so that its parent is the sandbox's first process).
        let x = run(
            &c,
            id,
            &ctx,
            "import subprocess\n\
             subprocess.Popen(['sleep', '1234'], start_new_session=True)\n\
             subprocess.run(['sh', '-c', 'setsid sleep 1235 >/dev/null 2>&1 &'])",
        )
        .await;
        assert_eq!(x.status, RunStatus::Ok, "{x:?}");
        run(
            &c,
            id,
            &other,
            "import subprocess\nsubprocess.Popen(['sleep', '4321'], start_new_session=True)",
        )
        .await;
        eventually(30, "the processes to start", || async {
            sleeping(&c, id, "1234").await + sleeping(&c, id, "1235").await == 2
        })
        .await;
        c.restart_context(id, &ctx).await.unwrap();
        eventually(30, "the processes the kernel left to end", || async {
            sleeping(&c, id, "1234").await + sleeping(&c, id, "1235").await == 0
        })
        .await;
        // Another context's are its own.
        assert_eq!(sleeping(&c, id, "4321").await, 1);
        c.delete_sandbox(id).await.unwrap();
    });
}
