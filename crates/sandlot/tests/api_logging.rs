//! The daemon's log as an operator reads it: with `log_format = "json"` every line
//! is one JSON object, and every line of a request, its error answers (4xx
//! included) among them, carries the request id the client was given. Needs root.

mod api_support;

use api_support::Daemon;
use serde_json::Value;

/// The request id of each line (from its `request` span), with the line.
fn lines(log: &str) -> Vec<(Option<String>, Value)> {
    log.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("a log line is not JSON ({e}): {l}"));
            let rid = v["spans"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|s| s["name"] == "request")
                .and_then(|s| s["request_id"].as_str())
                .map(str::to_string);
            (rid, v)
        })
        .collect()
}

#[test]
fn json_log_lines_carry_the_request_id_of_every_answer() {
    let mut d = Daemon::start(Some("log_format = \"json\"\n"));
    let token = d.token("acme");
    // A 404 and a 400 over TCP, a 401 without a valid token.
    let (s404, b404) = d.tcp_raw(
        &token,
        "GET",
        "/v1/sandboxes/no-such-sandbox",
        "application/json",
        b"",
    );
    let (s400, b400) = d.tcp_raw(
        &token,
        "POST",
        "/v1/sandboxes",
        "application/json",
        br#"{"memory": 1}"#,
    );
    let (s401, b401) = d.tcp_raw(
        "not-a-token",
        "GET",
        "/v1/sandboxes",
        "application/json",
        b"",
    );
    assert_eq!((s404, s400, s401), (404, 400, 401), "{b404} {b400} {b401}");
    let log = d.log();
    let all = lines(&log);
    for (status, body) in [(404, &b404), (400, &b400), (401, &b401)] {
        let answer: Value = serde_json::from_str(body).unwrap();
        let rid = answer["error"]["request_id"].as_str().unwrap();
        let mine: Vec<_> = all
            .iter()
            .filter(|(r, _)| r.as_deref() == Some(rid))
            .collect();
        assert!(
            mine.iter().any(|(_, v)| v["fields"]["status"] == status
                && v["fields"]["code"] == answer["error"]["code"]
                && v["fields"]["message"] == answer["error"]["message"]),
            "no line of {rid} records the {status} answer:\n{log}"
        );
    }
    // A request's own lines carry its id too (the token was made through the daemon).
    assert!(
        all.iter()
            .any(|(r, v)| r.as_deref().is_some_and(|r| r.starts_with("req_"))
                && v["fields"]["message"] == "token created"),
        "{log}"
    );
    d.shutdown();
}

#[test]
fn a_text_log_has_no_json_lines_and_an_unknown_format_is_a_usage_error() {
    let mut d = Daemon::start(Some("log_format = \"text\"\n"));
    assert!(
        d.log()
            .lines()
            .all(|l| serde_json::from_str::<Value>(l).is_err()),
        "{}",
        d.log()
    );
    d.shutdown();
    let o = std::process::Command::new(api_support::sandlot())
        .args(["serve", "--log-format", "yaml"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("yaml") && err.contains("json"),
        "{err}"
    );
}
