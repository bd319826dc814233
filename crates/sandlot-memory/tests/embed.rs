//! The embedders: all-MiniLM-L6-v2 semantics and agreement with an independent reference, and the
//! OpenAI-compatible HTTP client against a small local server started by the test.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use common::*;
use sandlot_memory::embed::dot;
use sandlot_memory::{Embedder, HttpEmbedder, MiniLmEmbedder, SearchMode, SearchQuery, Store};

#[test]
fn minilm_vectors_are_unit_length_and_semantic() {
    let m = minilm();
    let texts = [
        "A man is eating food.",
        "A man is eating a piece of bread.",
        "The girl is carrying a baby.",
        "A man is riding a horse.",
        "Quarterly revenue grew by eight percent.",
        "Sales in the last three months rose 8%.",
    ];
    let v = m.embed(&texts).unwrap();
    assert_eq!(v.len(), texts.len());
    for x in &v {
        assert_eq!(x.len(), 384);
        let n: f32 = x.iter().map(|a| a * a).sum();
        assert!((n - 1.0).abs() < 1e-4, "norm {n}");
    }
    let s = |a: usize, b: usize| dot(&v[a], &v[b]);
    assert!(s(0, 1) > 0.6, "eating pair {}", s(0, 1));
    assert!(s(4, 5) > 0.6, "revenue pair {}", s(4, 5));
    assert!(s(0, 1) > s(0, 2) + 0.3 && s(0, 1) > s(0, 4) + 0.3);
    assert!(s(4, 5) > s(4, 3) + 0.3);
    // Batching and padding do not change results.
    let single = m.embed(&[texts[2]]).unwrap();
    assert!(dot(&single[0], &v[2]) > 0.9999);
    // Empty input is fine.
    assert!(m.embed(&[]).unwrap().is_empty());
}

/// Reference vectors from an independent NumPy implementation of BERT + mean pooling
/// (crates/sandlot-memory/tests/reference/minilm_reference.py, run on the same weights and
/// tokenizer), so a silent mistake in pooling, masking or normalisation fails here.
#[test]
fn minilm_matches_reference_implementation() {
    let reference: serde_json::Value =
        serde_json::from_str(include_str!("reference/minilm_reference.json")).unwrap();
    let m = minilm();
    for case in reference["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want: Vec<f32> = case["vector"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let got = &m.embed(&[text]).unwrap()[0];
        let cos = dot(got, &want);
        let max_abs = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            cos > 0.9999 && max_abs < 2e-3,
            "{text:?}: cos {cos}, max diff {max_abs}"
        );
    }
}

#[test]
fn missing_model_names_the_setup_script() {
    let d = TempDir::new("nomodel");
    let e = MiniLmEmbedder::load(d.path())
        .err()
        .expect("loading from an empty dir must fail");
    let msg = e.to_string();
    assert!(
        msg.contains("model.safetensors") && msg.contains("scripts/setup.d/40-memory.sh"),
        "{msg}"
    );
}

/// A one-thread OpenAI-compatible embeddings server on 127.0.0.1 backed by the real model.
struct Server {
    url: String,
    stop: Arc<AtomicBool>,
    requests: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
    addr: std::net::SocketAddr,
}

#[derive(Clone, Copy)]
enum Behaviour {
    Status500,
    WrongDim,
    Shuffled,
}

impl Server {
    fn start(behaviour: Behaviour) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(AtomicUsize::new(0));
        let (stop2, req2) = (stop.clone(), requests.clone());
        let model = minilm();
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                req2.fetch_add(1, Ordering::SeqCst);
                handle(conn, &model, behaviour);
            }
        });
        Server {
            url: format!("http://{addr}/v1"),
            stop,
            requests,
            thread: Some(thread),
            addr,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn handle(mut conn: TcpStream, model: &MiniLmEmbedder, behaviour: Behaviour) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut request_line = String::new();
    reader.read_line(&mut request_line).unwrap();
    let mut len = 0usize;
    let mut auth = String::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).unwrap();
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap();
        match k.to_ascii_lowercase().as_str() {
            "content-length" => len = v.trim().parse().unwrap(),
            "authorization" => auth = v.trim().to_string(),
            _ => {}
        }
    }
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).unwrap();
    assert!(
        request_line.starts_with("POST /v1/embeddings "),
        "{request_line}"
    );
    assert_eq!(auth, "Bearer test-key");
    let req: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(req["model"], "all-MiniLM-L6-v2");
    let inputs: Vec<String> = req["input"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect();
    let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    let vecs = model.embed(&refs).unwrap();
    let mut data: Vec<serde_json::Value> = vecs
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let v: Vec<f32> = match behaviour {
                Behaviour::WrongDim => v[..100].to_vec(),
                // Unnormalised: the client must normalise.
                _ => v.iter().map(|x| x * 3.0).collect(),
            };
            serde_json::json!({"object": "embedding", "index": i, "embedding": v})
        })
        .collect();
    if matches!(behaviour, Behaviour::Shuffled) {
        data.reverse();
    }
    let (status, out) = match behaviour {
        Behaviour::Status500 => (
            "500 Internal Server Error",
            r#"{"error":"model overloaded"}"#.to_string(),
        ),
        _ => (
            "200 OK",
            serde_json::json!({"object": "list", "data": data, "model": "all-MiniLM-L6-v2"})
                .to_string(),
        ),
    };
    let _ = write!(
        conn,
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{out}",
        out.len()
    );
}

#[test]
fn http_embedder_speaks_the_openai_protocol() {
    let server = Server::start(Behaviour::Shuffled);
    let http = HttpEmbedder::new(
        &server.url,
        "all-MiniLM-L6-v2",
        384,
        Some("test-key".into()),
    );
    assert_eq!(http.model_id(), "http:all-MiniLM-L6-v2");
    let texts = ["the cat sat on the mat", "stock markets fell sharply"];
    let got = http.embed(&texts).unwrap();
    let want = minilm().embed(&texts).unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert!(dot(g, w) > 0.9999, "order or normalisation wrong");
    }
    assert_eq!(server.requests.load(Ordering::SeqCst), 1);

    // A store using the HTTP embedder searches semantically.
    let d = TempDir::new("http-store");
    let store = Store::init(d.path(), Arc::new(http), &agent()).unwrap();
    store
        .add(
            sandlot_memory::NewMemory {
                title: "Pets".into(),
                body: "Our office dog is a golden retriever named Biscuit.".into(),
                ..Default::default()
            },
            &agent(),
        )
        .unwrap();
    store
        .add(
            sandlot_memory::NewMemory {
                title: "Finance".into(),
                body: "The quarterly budget review is on Friday.".into(),
                ..Default::default()
            },
            &agent(),
        )
        .unwrap();
    let mut q = SearchQuery::new("which animal lives at work");
    q.mode = SearchMode::Vector;
    assert_eq!(store.search(&q).unwrap()[0].path, "pets.md");
}

#[test]
fn http_embedder_reports_server_errors() {
    let server = Server::start(Behaviour::Status500);
    let http = HttpEmbedder::new(
        &server.url,
        "all-MiniLM-L6-v2",
        384,
        Some("test-key".into()),
    );
    let e = http.embed(&["x"]).unwrap_err().to_string();
    assert!(
        e.contains("500") && e.contains("model overloaded") && e.contains("/v1/embeddings"),
        "{e}"
    );
    drop(server);

    let server = Server::start(Behaviour::WrongDim);
    let http = HttpEmbedder::new(
        &server.url,
        "all-MiniLM-L6-v2",
        384,
        Some("test-key".into()),
    );
    let e = http.embed(&["x"]).unwrap_err().to_string();
    assert!(e.contains("expected dimension 384, got 100"), "{e}");
    drop(server);

    // Nothing listening: a connection error, not a hang.
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let http = HttpEmbedder::new(&format!("http://127.0.0.1:{port}/v1"), "m", 384, None);
    assert!(http.embed(&["x"]).is_err());
}
