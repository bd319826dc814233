//! Reading the destination name from the first bytes of a TCP connection: the TLS
//! ClientHello's server name (SNI) or the HTTP/1 `Host` header. Pure; fed the bytes
//! the proxy has buffered so far.

/// What the first bytes say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sniffed {
    /// A TLS ClientHello naming this server. `ech` is set when it carries an
    /// Encrypted Client Hello extension (the real name is then hidden).
    Tls { sni: String, ech: bool },
    /// A TLS ClientHello without a server name.
    TlsNoSni,
    /// An HTTP/1 request; `host` without the port. `header_end` is the offset just
    /// past the header block's final CRLF CRLF.
    Http { host: String, header_end: usize },
    /// An HTTP request the proxy refuses (no Host, `CONNECT`, an absolute URI whose
    /// host differs from `Host`, several Host headers).
    BadHttp(String),
    /// Not enough bytes yet.
    NeedMore,
    /// Neither TLS nor HTTP.
    Unknown,
}

/// Largest prefix the proxy buffers while looking for a name.
pub const MAX_PEEK: usize = 16 * 1024;

/// Parses what the client has sent so far.
pub fn sniff(buf: &[u8]) -> Sniffed {
    if buf.is_empty() {
        return Sniffed::NeedMore;
    }
    if buf[0] == 0x16 {
        return sniff_tls(buf);
    }
    if buf[0].is_ascii_uppercase() {
        return sniff_http(buf);
    }
    Sniffed::Unknown
}

struct Reader<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.i..self.i.checked_add(n)?)?;
        self.i += n;
        Some(s)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|s| s[0] as usize)
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2).map(|s| (s[0] as usize) << 8 | s[1] as usize)
    }
}

fn sniff_tls(buf: &[u8]) -> Sniffed {
    // Reassemble the handshake payload from consecutive handshake records.
    let mut hs = Vec::new();
    let mut i = 0;
    let mut need: Option<usize> = None;
    while i < buf.len() {
        if buf.len() < i + 5 {
            return Sniffed::NeedMore;
        }
        if buf[i] != 0x16 || buf[i + 1] != 3 {
            return Sniffed::Unknown;
        }
        let len = (buf[i + 3] as usize) << 8 | buf[i + 4] as usize;
        let end = i + 5 + len;
        hs.extend_from_slice(&buf[i + 5..end.min(buf.len())]);
        if need.is_none() && hs.len() >= 4 {
            if hs[0] != 1 {
                return Sniffed::Unknown;
            }
            need = Some(4 + ((hs[1] as usize) << 16 | (hs[2] as usize) << 8 | hs[3] as usize));
        }
        if let Some(n) = need {
            if hs.len() >= n {
                return parse_client_hello(&hs[4..n]);
            }
        }
        if end > buf.len() {
            return Sniffed::NeedMore;
        }
        i = end;
    }
    if buf.len() >= MAX_PEEK {
        return Sniffed::Unknown;
    }
    Sniffed::NeedMore
}

fn parse_client_hello(b: &[u8]) -> Sniffed {
    let mut r = Reader { b, i: 0 };
    let parsed = (|| {
        r.take(2 + 32)?; // version, random
        let sid = r.u8()?;
        r.take(sid)?;
        let cs = r.u16()?;
        r.take(cs)?;
        let comp = r.u8()?;
        r.take(comp)?;
        let ext_len = r.u16()?;
        let exts = r.take(ext_len)?;
        let mut e = Reader { b: exts, i: 0 };
        let mut sni = None;
        let mut ech = false;
        while e.i < exts.len() {
            let ty = e.u16()?;
            let len = e.u16()?;
            let data = e.take(len)?;
            match ty {
                0 => {
                    let mut d = Reader { b: data, i: 0 };
                    let list = d.u16()?;
                    let list = d.take(list)?;
                    let mut l = Reader { b: list, i: 0 };
                    while l.i < list.len() {
                        let kind = l.u8()?;
                        let n = l.u16()?;
                        let name = l.take(n)?;
                        if kind == 0 {
                            sni = Some(String::from_utf8(name.to_vec()).ok()?);
                        }
                    }
                }
                0xfe0d => ech = true,
                _ => {}
            }
        }
        Some((sni, ech))
    })();
    match parsed {
        Some((Some(sni), ech)) => Sniffed::Tls { sni, ech },
        Some((None, _)) => Sniffed::TlsNoSni,
        None => Sniffed::Unknown,
    }
}

fn sniff_http(buf: &[u8]) -> Sniffed {
    let Some(end) = find(buf, b"\r\n\r\n") else {
        // A request line must look like one early on.
        let line_end = find(buf, b"\r\n").unwrap_or(buf.len());
        if !looks_like_method(&buf[..line_end.min(buf.len())]) {
            return Sniffed::Unknown;
        }
        return if buf.len() >= MAX_PEEK {
            Sniffed::BadHttp("request headers larger than 16 KiB".into())
        } else {
            Sniffed::NeedMore
        };
    };
    let Ok(head) = std::str::from_utf8(&buf[..end]) else {
        return Sniffed::BadHttp("request headers are not UTF-8".into());
    };
    let mut lines = head.split("\r\n");
    let request = lines.next().unwrap_or("");
    let mut parts = request.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if !looks_like_method(method.as_bytes())
        || !parts.next().is_some_and(|v| v.starts_with("HTTP/"))
    {
        return Sniffed::Unknown;
    }
    if method == "CONNECT" {
        return Sniffed::BadHttp("CONNECT is refused: this is not a forward proxy".into());
    }
    let mut host = None;
    for l in lines {
        if let Some((k, v)) = l.split_once(':') {
            if k.trim().eq_ignore_ascii_case("host") {
                if host.is_some() {
                    return Sniffed::BadHttp("several Host headers".into());
                }
                host = Some(strip_port(v.trim()).to_ascii_lowercase());
            }
        }
    }
    let Some(host) = host.filter(|h| !h.is_empty()) else {
        return Sniffed::BadHttp("no Host header".into());
    };
    // An absolute URI names the host too; both must agree.
    let lower = target.to_ascii_lowercase();
    if let Some(rest) = lower
        .strip_prefix("http://")
        .or_else(|| lower.strip_prefix("https://"))
    {
        let auth = rest.split(['/', '?', '#']).next().unwrap_or("");
        let auth = auth.rsplit('@').next().unwrap_or("");
        if strip_port(auth) != host {
            return Sniffed::BadHttp(format!(
                "the request URI names {:?} but Host is {host:?}",
                strip_port(auth)
            ));
        }
    }
    Sniffed::Http {
        host,
        header_end: end + 4,
    }
}

fn looks_like_method(b: &[u8]) -> bool {
    let m: &[u8] = b.split(|c| *c == b' ').next().unwrap_or(b);
    !m.is_empty() && m.len() <= 16 && m.iter().all(u8::is_ascii_uppercase)
}

fn strip_port(h: &str) -> &str {
    if let Some(rest) = h.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match h.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => h,
    }
}

fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}

/// The first request's header block with every `Connection` header replaced by
/// `Connection: close`, so that a keep-alive connection cannot carry a second
/// request for another host (`header_end` from [`Sniffed::Http`]).
pub fn force_connection_close(buf: &[u8], header_end: usize) -> Vec<u8> {
    let head = String::from_utf8_lossy(&buf[..header_end - 4]);
    let mut out = String::with_capacity(header_end + 20);
    for (i, l) in head.split("\r\n").enumerate() {
        let is_conn = i > 0
            && l.split_once(':').is_some_and(|(k, _)| {
                let k = k.trim();
                k.eq_ignore_ascii_case("connection") || k.eq_ignore_ascii_case("keep-alive")
            });
        if !is_conn {
            out.push_str(l);
            out.push_str("\r\n");
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    let mut v = out.into_bytes();
    v.extend_from_slice(&buf[header_end..]);
    v
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal TLS 1.2/1.3 ClientHello with the given SNI (and ECH if asked).
    pub fn client_hello(sni: Option<&str>, ech: bool) -> Vec<u8> {
        let mut exts = Vec::new();
        if let Some(n) = sni {
            let n = n.as_bytes();
            let mut list = vec![0u8];
            list.extend_from_slice(&(n.len() as u16).to_be_bytes());
            list.extend_from_slice(n);
            let mut data = (list.len() as u16).to_be_bytes().to_vec();
            data.extend_from_slice(&list);
            exts.extend_from_slice(&0u16.to_be_bytes());
            exts.extend_from_slice(&(data.len() as u16).to_be_bytes());
            exts.extend_from_slice(&data);
        }
        if ech {
            exts.extend_from_slice(&[0xfe, 0x0d, 0, 1, 0]);
        }
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.push(0); // session id
        body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one cipher suite
        body.extend_from_slice(&[1, 0]); // null compression
        body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        body.extend_from_slice(&exts);
        let mut hs = vec![1];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&body);
        let mut rec = vec![0x16, 3, 1];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    #[test]
    fn sni_is_read_from_a_client_hello() {
        let ch = client_hello(Some("allowed.test"), false);
        assert_eq!(
            sniff(&ch),
            Sniffed::Tls {
                sni: "allowed.test".into(),
                ech: false
            }
        );
        for cut in [1, 4, 5, 20, ch.len() - 1] {
            assert_eq!(sniff(&ch[..cut]), Sniffed::NeedMore, "cut at {cut}");
        }
        assert_eq!(sniff(&client_hello(None, false)), Sniffed::TlsNoSni);
        assert!(matches!(
            sniff(&client_hello(Some("a.test"), true)),
            Sniffed::Tls { ech: true, .. }
        ));
    }

    #[test]
    fn a_client_hello_split_over_two_records_is_reassembled() {
        let ch = client_hello(Some("split.test"), false);
        let hs = &ch[5..];
        let (a, b) = hs.split_at(10);
        let mut two = Vec::new();
        for part in [a, b] {
            two.extend_from_slice(&[0x16, 3, 1]);
            two.extend_from_slice(&(part.len() as u16).to_be_bytes());
            two.extend_from_slice(part);
        }
        assert!(matches!(sniff(&two), Sniffed::Tls { sni, .. } if sni == "split.test"));
    }

    #[test]
    fn garbage_tls_is_unknown() {
        let mut ch = client_hello(Some("a.test"), false);
        ch[5] = 2; // ServerHello, not ClientHello
        assert_eq!(sniff(&ch), Sniffed::Unknown);
        assert_eq!(sniff(b"\x00\x01binary"), Sniffed::Unknown);
        assert_eq!(sniff(b"SSH-2.0-OpenSSH_9\r\n"), Sniffed::Unknown);
    }

    #[test]
    fn http_host_is_read() {
        let r = b"GET / HTTP/1.1\r\nUser-Agent: x\r\nhost: Allowed.Test:8080\r\n\r\nbody";
        assert_eq!(
            sniff(r),
            Sniffed::Http {
                host: "allowed.test".into(),
                header_end: r.len() - 4
            }
        );
        assert_eq!(sniff(b"GET / HTTP/1.1\r\nHost: a"), Sniffed::NeedMore);
        assert!(matches!(
            sniff(b"GET / HTTP/1.1\r\n\r\n"),
            Sniffed::BadHttp(_)
        ));
        assert!(matches!(
            sniff(b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n"),
            Sniffed::BadHttp(_)
        ));
        assert!(matches!(
            sniff(b"CONNECT denied.test:443 HTTP/1.1\r\nHost: denied.test\r\n\r\n"),
            Sniffed::BadHttp(_)
        ));
        assert!(matches!(
            sniff(b"GET http://denied.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n"),
            Sniffed::BadHttp(_)
        ));
        assert!(matches!(
            sniff(b"GET http://allowed.test:80/x HTTP/1.1\r\nHost: allowed.test\r\n\r\n"),
            Sniffed::Http { .. }
        ));
        let v6 = b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n";
        assert_eq!(
            sniff(v6),
            Sniffed::Http {
                host: "::1".into(),
                header_end: v6.len()
            }
        );
    }

    #[test]
    fn keep_alive_is_turned_off() {
        let r =
            b"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: keep-alive\r\n\r\nGET /2 HTTP/1.1\r\n";
        let Sniffed::Http { header_end, .. } = sniff(r) else {
            panic!()
        };
        let out = force_connection_close(r, header_end);
        let s = String::from_utf8(out).unwrap();
        assert_eq!(
            s,
            "GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\nGET /2 HTTP/1.1\r\n"
        );
    }
}
