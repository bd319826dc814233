//! Prometheus text-format metrics, kept with atomics (no registry crate).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds (seconds) of the create latency histogram.
const CREATE_BUCKETS: &[f64] = &[
    0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

#[derive(Default)]
pub struct Metrics {
    pub live_sandboxes: AtomicI64,
    pub sandboxes_created: AtomicU64,
    pub exec_total: AtomicU64,
    pub requests_total: AtomicU64,
    create_buckets: [AtomicU64; 11],
    create_count: AtomicU64,
    create_sum_us: AtomicU64,
    errors: Mutex<BTreeMap<&'static str, u64>>,
    stopped: Mutex<BTreeMap<&'static str, u64>>,
    /// Inbound traffic: the HTTP/WebSocket proxy and published TCP ports.
    pub ports: PortMetrics,
}

/// Counters of inbound traffic to sandboxes (`ports.rs`, `routes/ports.rs`).
#[derive(Default)]
pub struct PortMetrics {
    /// HTTP requests proxied to a sandbox port (WebSocket upgrades included).
    pub http_requests: AtomicU64,
    /// WebSocket (and other HTTP upgrade) tunnels opened.
    pub upgrades: AtomicU64,
    /// Connections accepted on published TCP ports.
    pub tcp_connections: AtomicU64,
    /// Dials of a sandbox port that failed (nothing listening, timeout).
    pub dial_failures: AtomicU64,
    /// Body and tunnel bytes sent to sandboxes.
    pub bytes_to_sandbox: AtomicU64,
    /// Body and tunnel bytes received from sandboxes.
    pub bytes_from_sandbox: AtomicU64,
    /// Ports published on the host now.
    pub published: AtomicI64,
}

impl PortMetrics {
    fn render(&self, o: &mut String) {
        let c = |o: &mut String, name: &str, help: &str, kind: &str, v: String| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
        };
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed).to_string();
        c(
            o,
            "sandlot_port_http_requests_total",
            "HTTP requests proxied to sandbox ports.",
            "counter",
            l(&self.http_requests),
        );
        c(
            o,
            "sandlot_port_upgrades_total",
            "WebSocket (HTTP upgrade) tunnels to sandbox ports.",
            "counter",
            l(&self.upgrades),
        );
        c(
            o,
            "sandlot_port_tcp_connections_total",
            "Connections accepted on published TCP ports.",
            "counter",
            l(&self.tcp_connections),
        );
        c(
            o,
            "sandlot_port_dial_failures_total",
            "Failed dials of a sandbox port (nothing listening, timeout).",
            "counter",
            l(&self.dial_failures),
        );
        let _ = writeln!(o, "# HELP sandlot_port_bytes_total Bytes proxied to (in) and from (out) sandbox ports.\n# TYPE sandlot_port_bytes_total counter");
        let _ = writeln!(
            o,
            "sandlot_port_bytes_total{{direction=\"in\"}} {}",
            l(&self.bytes_to_sandbox)
        );
        let _ = writeln!(
            o,
            "sandlot_port_bytes_total{{direction=\"out\"}} {}",
            l(&self.bytes_from_sandbox)
        );
        c(
            o,
            "sandlot_ports_published",
            "Sandbox ports published on the host now.",
            "gauge",
            self.published.load(Ordering::Relaxed).to_string(),
        );
    }
}

impl Metrics {
    pub fn observe_create(&self, d: Duration) {
        let s = d.as_secs_f64();
        for (i, b) in CREATE_BUCKETS.iter().enumerate() {
            if s <= *b {
                self.create_buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.create_count.fetch_add(1, Ordering::Relaxed);
        self.create_sum_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    pub fn error(&self, code: &'static str) {
        *self
            .errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(code)
            .or_default() += 1;
    }

    pub fn stopped(&self, reason: &'static str) {
        *self
            .stopped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(reason)
            .or_default() += 1;
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let g = |o: &mut String, name: &str, help: &str, kind: &str, v: String| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
        };
        g(
            &mut o,
            "sandlot_sandboxes_live",
            "Sandboxes currently alive (creating, running or stopping).",
            "gauge",
            self.live_sandboxes.load(Ordering::Relaxed).to_string(),
        );
        g(
            &mut o,
            "sandlot_sandboxes_created_total",
            "Sandboxes created successfully.",
            "counter",
            self.sandboxes_created.load(Ordering::Relaxed).to_string(),
        );
        g(
            &mut o,
            "sandlot_orphans_reaped_total",
            "Orphaned descendants the daemon adopted (as a child subreaper) and reaped.",
            "counter",
            sandlot_runtime::orphans::reaped().to_string(),
        );
        g(
            &mut o,
            "sandlot_exec_total",
            "Processes started through the API.",
            "counter",
            self.exec_total.load(Ordering::Relaxed).to_string(),
        );
        g(
            &mut o,
            "sandlot_http_requests_total",
            "HTTP requests served.",
            "counter",
            self.requests_total.load(Ordering::Relaxed).to_string(),
        );
        let _ = writeln!(o, "# HELP sandlot_sandbox_create_seconds Time to create a sandbox (runtime create and agent connection).");
        let _ = writeln!(o, "# TYPE sandlot_sandbox_create_seconds histogram");
        for (i, b) in CREATE_BUCKETS.iter().enumerate() {
            let _ = writeln!(
                o,
                "sandlot_sandbox_create_seconds_bucket{{le=\"{b}\"}} {}",
                self.create_buckets[i].load(Ordering::Relaxed)
            );
        }
        let n = self.create_count.load(Ordering::Relaxed);
        let _ = writeln!(
            o,
            "sandlot_sandbox_create_seconds_bucket{{le=\"+Inf\"}} {n}"
        );
        let _ = writeln!(
            o,
            "sandlot_sandbox_create_seconds_sum {}",
            self.create_sum_us.load(Ordering::Relaxed) as f64 / 1e6
        );
        let _ = writeln!(o, "sandlot_sandbox_create_seconds_count {n}");
        let _ = writeln!(
            o,
            "# HELP sandlot_http_errors_total Error responses by error code."
        );
        let _ = writeln!(o, "# TYPE sandlot_http_errors_total counter");
        for (code, v) in self.errors.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(o, "sandlot_http_errors_total{{code=\"{code}\"}} {v}");
        }
        let _ = writeln!(
            o,
            "# HELP sandlot_sandboxes_stopped_total Sandboxes stopped, by reason."
        );
        let _ = writeln!(o, "# TYPE sandlot_sandboxes_stopped_total counter");
        for (r, v) in self
            .stopped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = writeln!(o, "sandlot_sandboxes_stopped_total{{reason=\"{r}\"}} {v}");
        }
        self.ports.render(&mut o);
        o
    }
}

/// Sandboxes stopped whose host side (cgroups, run directory, network slot,
/// references) is still being cleaned up off the request path.
pub fn render_teardowns(o: &mut String, pending: usize) {
    let _ = writeln!(
        o,
        "# HELP sandlot_teardowns_pending Stopped sandboxes whose host resources are still being released.\n\
         # TYPE sandlot_teardowns_pending gauge\n\
         sandlot_teardowns_pending {pending}"
    );
}

/// The runtime's stocks of cgroups and network namespaces made ahead of time
/// (`runtime.cgroup_stock`, `runtime.netns_stock`): items ready now.
pub fn render_stocks(o: &mut String, cgroups: usize, netns: usize) {
    let _ = writeln!(
        o,
        "# HELP sandlot_runtime_stock_ready Items the runtime made ahead of time and has ready, by kind.\n\
         # TYPE sandlot_runtime_stock_ready gauge\n\
         sandlot_runtime_stock_ready{{kind=\"cgroup\"}} {cgroups}\n\
         sandlot_runtime_stock_ready{{kind=\"netns\"}} {netns}"
    );
}

/// The egress limits (`[network] max_connections_per_*`, `max_dns_per_*`,
/// `idle_timeout`, `half_close_timeout`).
pub fn render_egress(o: &mut String, e: &sandlot_net::EgressSnapshot) {
    let _ = writeln!(
        o,
        "# HELP sandlot_egress_connections_open Connections open through the egress proxy.\n\
         # TYPE sandlot_egress_connections_open gauge\n\
         sandlot_egress_connections_open {}\n\
         # HELP sandlot_egress_dns_in_flight DNS queries of sandboxes the resolver is working on.\n\
         # TYPE sandlot_egress_dns_in_flight gauge\n\
         sandlot_egress_dns_in_flight {}\n\
         # HELP sandlot_egress_refused_total Egress connections and DNS queries refused by a cap, by the cap.\n\
         # TYPE sandlot_egress_refused_total counter",
        e.connections_open, e.dns_in_flight
    );
    for (kind, limit, n) in &e.refused {
        let _ = writeln!(
            o,
            "sandlot_egress_refused_total{{kind=\"{kind}\",limit=\"{limit}\"}} {n}"
        );
    }
    let _ = writeln!(
        o,
        "# HELP sandlot_egress_closed_total Proxied connections closed by a timeout.\n\
         # TYPE sandlot_egress_closed_total counter\n\
         sandlot_egress_closed_total{{reason=\"idle\"}} {}\n\
         sandlot_egress_closed_total{{reason=\"half_closed\"}} {}\n\
         # HELP sandlot_egress_audit_dropped_total Egress audit entries left out by the per-sandbox rate limit.\n\
         # TYPE sandlot_egress_audit_dropped_total counter\n\
         sandlot_egress_audit_dropped_total {}",
        e.closed_idle, e.closed_half_closed, e.audit_dropped
    );
}

/// The open-file limit, how it is shared out, what is held, and the descriptors
/// the daemon has open now (one directory read per scrape).
pub fn render_descriptors(
    o: &mut String,
    plan: &crate::inbound::DescriptorPlan,
    inbound_held: usize,
    egress_held: usize,
) {
    let open = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    let _ = writeln!(
        o,
        "# HELP sandlot_open_files The daemon's open descriptors.\n\
         # TYPE sandlot_open_files gauge\n\
         sandlot_open_files {open}\n\
         # HELP sandlot_open_files_limit The daemon's open-file limit (raised to the hard limit at start).\n\
         # TYPE sandlot_open_files_limit gauge\n\
         sandlot_open_files_limit {}\n\
         # HELP sandlot_descriptors_budget How the open-file limit is shared out: kept for the operator and sandboxes, TCP clients, egress.\n\
         # TYPE sandlot_descriptors_budget gauge\n\
         sandlot_descriptors_budget{{use=\"reserve\"}} {}\n\
         sandlot_descriptors_budget{{use=\"tcp_clients\"}} {}\n\
         sandlot_descriptors_budget{{use=\"egress\"}} {}\n\
         # HELP sandlot_descriptors_held Descriptors TCP clients and egress hold now.\n\
         # TYPE sandlot_descriptors_held gauge\n\
         sandlot_descriptors_held{{use=\"tcp_clients\"}} {inbound_held}\n\
         sandlot_descriptors_held{{use=\"egress\"}} {egress_held}",
        plan.limit, plan.reserve, plan.inbound, plan.egress
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_pending_teardowns() {
        let mut t = String::new();
        render_teardowns(&mut t, 7);
        assert!(
            t.contains("# TYPE sandlot_teardowns_pending gauge\n"),
            "{t}"
        );
        assert!(t.ends_with("\nsandlot_teardowns_pending 7\n"), "{t}");
    }

    #[test]
    fn renders_the_runtime_stocks() {
        let mut t = String::new();
        render_stocks(&mut t, 3, 4);
        assert!(
            t.contains("# TYPE sandlot_runtime_stock_ready gauge\n"),
            "{t}"
        );
        assert!(
            t.contains("sandlot_runtime_stock_ready{kind=\"cgroup\"} 3\n"),
            "{t}"
        );
        assert!(
            t.ends_with("sandlot_runtime_stock_ready{kind=\"netns\"} 4\n"),
            "{t}"
        );
    }

    #[test]
    fn renders_the_egress_limits_and_descriptors() {
        let mut t = String::new();
        render_egress(
            &mut t,
            &sandlot_net::EgressSnapshot {
                connections_open: 3,
                refused: vec![("tcp", "sandbox", 7)],
                closed_half_closed: 2,
                ..Default::default()
            },
        );
        render_descriptors(
            &mut t,
            &crate::inbound::DescriptorPlan::new(1000, &Default::default()),
            4,
            6,
        );
        for want in [
            "sandlot_egress_connections_open 3\n",
            "sandlot_egress_refused_total{kind=\"tcp\",limit=\"sandbox\"} 7\n",
            "sandlot_egress_closed_total{reason=\"half_closed\"} 2\n",
            "sandlot_open_files_limit 1000\n",
            "sandlot_descriptors_budget{use=\"reserve\"} 500\n",
            "sandlot_descriptors_held{use=\"egress\"} 6\n",
        ] {
            assert!(t.contains(want), "{want} missing from\n{t}");
        }
        for l in t.lines().filter(|l| !l.starts_with('#')) {
            let v = l.rsplit(' ').next().unwrap();
            assert!(v.parse::<f64>().is_ok(), "{l}");
        }
    }

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.observe_create(Duration::from_millis(3));
        m.observe_create(Duration::from_millis(30));
        m.error("not_found");
        m.error("not_found");
        m.exec_total.fetch_add(3, Ordering::Relaxed);
        let t = m.render();
        assert!(
            t.contains("sandlot_sandbox_create_seconds_bucket{le=\"0.005\"} 1\n"),
            "{t}"
        );
        assert!(
            t.contains("sandlot_sandbox_create_seconds_bucket{le=\"0.05\"} 2\n"),
            "{t}"
        );
        assert!(
            t.contains("sandlot_sandbox_create_seconds_count 2\n"),
            "{t}"
        );
        assert!(
            t.contains("sandlot_http_errors_total{code=\"not_found\"} 2\n"),
            "{t}"
        );
        assert!(t.contains("sandlot_exec_total 3\n"), "{t}");
        m.ports.bytes_to_sandbox.fetch_add(5, Ordering::Relaxed);
        let t = m.render();
        assert!(
            t.contains("sandlot_port_bytes_total{direction=\"in\"} 5\n"),
            "{t}"
        );
        // Every sample line is `name{labels} value`.
        for l in t.lines().filter(|l| !l.starts_with('#')) {
            let v = l.rsplit(' ').next().unwrap();
            assert!(v.parse::<f64>().is_ok(), "{l}");
        }
    }
}
