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
    /// past the blank line that ends the header block.
    Http { host: String, header_end: usize },
    /// An opening the proxy refuses: HTTP that could name two hosts or none
    /// (`CONNECT`, an absolute URI whose host differs from `Host`, several or no
    /// Host headers, a malformed request), a malformed or oversized ClientHello.
    Refused(String),
    /// Not enough bytes yet.
    NeedMore,
    /// Neither TLS nor HTTP.
    Unknown,
}

/// Largest HTTP header block the proxy buffers while looking for `Host`.
pub const MAX_PEEK: usize = 16 * 1024;

/// Largest TLS ClientHello (handshake message) the proxy reads for its SNI.
pub const MAX_HELLO: usize = 64 * 1024;

/// Parses what the client has sent so far.
pub fn sniff(buf: &[u8]) -> Sniffed {
    match buf.first() {
        None => Sniffed::NeedMore,
        Some(0x16) => sniff_tls(buf),
        Some(c) if is_tchar(*c) || is_http_space(*c) => sniff_http(buf),
        Some(_) => Sniffed::Unknown,
    }
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
    // Reassemble the handshake payload from consecutive handshake records. Once the
    // first record has begun a ClientHello, anything else is refused: what the proxy
    // cannot read, it does not pass on unnamed.
    let mut hs = Vec::new();
    let mut i = 0;
    let mut need: Option<usize> = None;
    loop {
        if buf.len() < i + 5 {
            // Empty records cannot pad the buffer for ever.
            if buf.len() > MAX_HELLO + 4 * 1024 {
                return Sniffed::Refused("TLS records larger than 64 KiB".into());
            }
            return Sniffed::NeedMore;
        }
        if buf[i] != 0x16 || buf[i + 1] != 3 {
            return if need.is_some() || i > 0 {
                Sniffed::Refused("a ClientHello interrupted by another TLS record".into())
            } else {
                Sniffed::Unknown
            };
        }
        let len = (buf[i + 3] as usize) << 8 | buf[i + 4] as usize;
        let end = i + 5 + len;
        hs.extend_from_slice(&buf[i + 5..end.min(buf.len())]);
        if need.is_none() && hs.len() >= 4 {
            if hs[0] != 1 {
                return if i > 0 {
                    Sniffed::Refused("a ClientHello interrupted by another message".into())
                } else {
                    Sniffed::Unknown
                };
            }
            let n = 4 + ((hs[1] as usize) << 16 | (hs[2] as usize) << 8 | hs[3] as usize);
            if n > MAX_HELLO {
                return Sniffed::Refused(format!("a ClientHello of {n} bytes, larger than 64 KiB"));
            }
            need = Some(n);
        }
        if let Some(n) = need {
            if hs.len() >= n {
                return match parse_client_hello(&hs[4..n]) {
                    Some(s) => s,
                    None => Sniffed::Refused("a malformed ClientHello".into()),
                };
            }
        }
        if end >= buf.len() {
            if buf.len() > MAX_HELLO + 4 * 1024 {
                return Sniffed::Refused("TLS records larger than 64 KiB".into());
            }
            return Sniffed::NeedMore;
        }
        i = end;
    }
}

fn parse_client_hello(b: &[u8]) -> Option<Sniffed> {
    let mut r = Reader { b, i: 0 };
    r.take(2 + 32)?; // version, random
    let sid = r.u8()?;
    r.take(sid)?;
    let cs = r.u16()?;
    r.take(cs)?;
    let comp = r.u8()?;
    r.take(comp)?;
    if r.i == b.len() {
        // No extensions at all (old clients): no server name.
        return Some(Sniffed::TlsNoSni);
    }
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
                if sni.is_some() {
                    return None; // two server name extensions
                }
                let mut d = Reader { b: data, i: 0 };
                let list = d.u16()?;
                let list = d.take(list)?;
                let mut l = Reader { b: list, i: 0 };
                while l.i < list.len() {
                    let kind = l.u8()?;
                    let n = l.u16()?;
                    let name = l.take(n)?;
                    if kind == 0 {
                        if sni.is_some() {
                            return None; // two host names
                        }
                        sni = Some(String::from_utf8_lossy(name).into_owned());
                    }
                }
            }
            0xfe0d => ech = true,
            _ => {}
        }
    }
    Some(match sni {
        Some(sni) => match crate::policy::host_name_problem(&sni) {
            None => Sniffed::Tls { sni, ech },
            Some(why) => Sniffed::Refused(why),
        },
        None => Sniffed::TlsNoSni,
    })
}

/// Bytes that mean "not complete yet" for an HTTP opening of `len` bytes.
fn http_need_more(len: usize) -> Sniffed {
    if len >= MAX_PEEK {
        Sniffed::Refused("request headers larger than 16 KiB".into())
    } else {
        Sniffed::NeedMore
    }
}

/// The offset just past the blank line (`\r\n` or bare `\n`) that ends the header
/// block starting at `b[0]`.
fn header_block_end(b: &[u8]) -> Option<usize> {
    let mut line_start = 0;
    for (i, c) in b.iter().enumerate() {
        if *c != b'\n' {
            continue;
        }
        let line = &b[line_start..i];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() && line_start > 0 {
            return Some(i + 1);
        }
        line_start = i + 1;
    }
    None
}

/// What some server takes for space in a request line: Python's `http.server`
/// splits it with `str.split()` on Latin-1 text, so vertical tab, form feed,
/// the separators `0x1c`-`0x1f`, `0x85` and `0xa0` too.
fn is_http_space(c: u8) -> bool {
    matches!(
        c,
        b' ' | b'\t' | b'\r' | b'\n' | 0x0b | 0x0c | 0x1c..=0x1f | 0x85 | 0xa0
    )
}

/// A token character (RFC 9110): what a method is made of.
fn is_tchar(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

fn sniff_http(buf: &[u8]) -> Sniffed {
    // Servers skip empty lines (some, any whitespace) before the request line.
    let Some(start) = buf.iter().position(|c| !is_http_space(*c)) else {
        return http_need_more(buf.len());
    };
    let b = &buf[start..];
    // A method (an uppercase word of at most 16 letters) and a space or tab: from
    // here on, this is an HTTP request, and one the proxy cannot read is refused,
    // not passed on. Servers take other methods too (any token: `get`, `M-SEARCH`,
    // a long one): such a word begins an HTTP request when its line ends in an HTTP
    // version, so that text protocols (`get key`) stay unnamed; a token or a line
    // still open at the 16 KiB bound is refused, as it could be a request line.
    let too_long = || Sniffed::Refused("a request line longer than 16 KiB".into());
    let m = b.iter().take_while(|c| is_tchar(**c)).count();
    match b.get(m) {
        None if buf.len() >= MAX_PEEK => return too_long(),
        None => return Sniffed::NeedMore,
        Some(c) if is_http_space(*c) && !matches!(c, b'\r' | b'\n') => {}
        Some(_) => return Sniffed::Unknown,
    }
    let plain =
        m <= 16 && b[..m].iter().all(u8::is_ascii_uppercase) && matches!(b[m], b' ' | b'\t');
    if !plain {
        let Some(eol) = b.iter().position(|c| *c == b'\n') else {
            return if buf.len() >= MAX_PEEK {
                too_long()
            } else {
                Sniffed::NeedMore
            };
        };
        let line = b[..eol].strip_suffix(b"\r").unwrap_or(&b[..eol]);
        let last = line.rsplit(|c| is_http_space(*c)).next();
        if !last.is_some_and(|w| w.len() >= 5 && w[..5].eq_ignore_ascii_case(b"HTTP/")) {
            return Sniffed::Unknown;
        }
    }
    let Some(end) = header_block_end(b) else {
        return http_need_more(buf.len());
    };
    // A CR not ending a line, or a NUL: some servers end a line there (Python's
    // parser splits on a bare CR), so one header line here could be two there.
    let head_bytes = &b[..end];
    if head_bytes.contains(&0)
        || head_bytes
            .iter()
            .enumerate()
            .any(|(i, c)| *c == b'\r' && head_bytes.get(i + 1) != Some(&b'\n'))
    {
        return Sniffed::Refused("a bare CR or a NUL in the request headers".into());
    }
    let Ok(head) = std::str::from_utf8(head_bytes) else {
        return Sniffed::Refused("request headers are not UTF-8".into());
    };
    let mut lines = head.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let request = lines.next().unwrap_or("");
    let mut parts = request.split_ascii_whitespace();
    let (method, target, version) = (parts.next(), parts.next(), parts.next());
    let (Some(method), Some(target), Some(version)) = (method, target, version) else {
        return Sniffed::Refused("not an HTTP/1 request line".into());
    };
    if parts.next().is_some() || !version.to_ascii_uppercase().starts_with("HTTP/") {
        return Sniffed::Refused("not an HTTP/1 request line".into());
    }
    if method.eq_ignore_ascii_case("CONNECT") {
        return Sniffed::Refused("CONNECT is refused: this is not a forward proxy".into());
    }
    let mut host = None;
    for l in lines.filter(|l| !l.is_empty()) {
        if l.starts_with([' ', '\t']) {
            return Sniffed::Refused("a folded header line".into());
        }
        if let Some((k, v)) = l.split_once(':') {
            if k.trim().eq_ignore_ascii_case("host") {
                if host.is_some() {
                    return Sniffed::Refused("several Host headers".into());
                }
                let v = v.trim();
                // An IPv6 literal is `[address]` and an optional port, nothing else.
                if let Some(rest) = v.strip_prefix('[') {
                    let literal = rest.split_once(']').is_some_and(|(a, port)| {
                        a.parse::<std::net::Ipv6Addr>().is_ok()
                            && (port.is_empty()
                                || port.strip_prefix(':').is_some_and(|p| {
                                    !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())
                                }))
                    });
                    if !literal {
                        return Sniffed::Refused(format!(
                            "Host: {:?} is no IPv6 literal",
                            v.chars().take(64).collect::<String>()
                        ));
                    }
                }
                host = Some(strip_port(v).to_ascii_lowercase());
            }
        }
    }
    let Some(host) = host.filter(|h| !h.is_empty()) else {
        return Sniffed::Refused("no Host header".into());
    };
    let v6_literal = host.parse::<std::net::Ipv6Addr>().is_ok();
    if let Some(why) = crate::policy::host_name_problem(&host).filter(|_| !v6_literal) {
        return Sniffed::Refused(format!("Host: {why}"));
    }
    // An absolute URI (of any scheme: servers take the host from `ws://` as
    // from `http://`) names the host too; both must agree.
    let lower = target.to_ascii_lowercase();
    let scheme_end = lower.find("://").filter(|&i| {
        i > 0
            && lower[..i].starts_with(|c: char| c.is_ascii_alphabetic())
            && lower[..i]
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'-' | b'.'))
    });
    if let Some(rest) = scheme_end.map(|i| &lower[i + 3..]) {
        let auth = rest.split(['/', '?', '#']).next().unwrap_or("");
        let auth = auth.rsplit('@').next().unwrap_or("");
        if strip_port(auth) != host {
            return Sniffed::Refused(format!(
                "the request URI names {:?} but Host is {host:?}",
                strip_port(auth)
            ));
        }
    }
    Sniffed::Http {
        host,
        header_end: start + end,
    }
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

/// The first request's header block with every `Connection` header replaced by
/// `Connection: close`, so that a keep-alive connection cannot carry a second
/// request for another host (`header_end` from [`Sniffed::Http`]). Lines are
/// re-ended with CRLF and empty lines before the request line dropped.
pub fn force_connection_close(buf: &[u8], header_end: usize) -> Vec<u8> {
    let head = String::from_utf8_lossy(&buf[..header_end]);
    let mut out = String::with_capacity(header_end + 20);
    for (i, l) in head
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .filter(|l| !l.is_empty())
        .enumerate()
    {
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
        client_hello_padded(sni, ech, 0)
    }

    /// A ClientHello with a padding extension of `pad` bytes before the SNI, split
    /// into records of at most 16 KiB as TLS requires.
    pub fn client_hello_padded(sni: Option<&str>, ech: bool, pad: usize) -> Vec<u8> {
        let mut exts = Vec::new();
        if pad > 0 {
            exts.extend_from_slice(&21u16.to_be_bytes());
            exts.extend_from_slice(&(pad as u16).to_be_bytes());
            exts.extend_from_slice(&vec![0; pad]);
        }
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
        let mut rec = Vec::new();
        for part in hs.chunks(16 * 1024) {
            rec.extend_from_slice(&[0x16, 3, 1]);
            rec.extend_from_slice(&(part.len() as u16).to_be_bytes());
            rec.extend_from_slice(part);
        }
        rec
    }

    #[test]
    fn a_client_hello_longer_than_16_kib_is_read_to_its_stated_length() {
        // The SNI after a large extension, past the first 16 KiB.
        let ch = client_hello_padded(Some("allowed.test"), false, 17 * 1024);
        assert!(ch.len() > 17 * 1024);
        assert_eq!(
            sniff(&ch),
            Sniffed::Tls {
                sni: "allowed.test".into(),
                ech: false
            }
        );
        for cut in [16 * 1024, 16 * 1024 + 5, 16 * 1024 + 100, ch.len() - 1] {
            assert_eq!(sniff(&ch[..cut]), Sniffed::NeedMore, "cut at {cut}");
        }
    }

    #[test]
    fn a_client_hello_longer_than_64_kib_is_refused() {
        let mut ch = client_hello(Some("a.test"), false);
        // The handshake header states 70,000 bytes.
        ch[6..9].copy_from_slice(&70_000u32.to_be_bytes()[1..]);
        assert!(matches!(sniff(&ch), Sniffed::Refused(_)));
        // Empty records cannot grow the buffer without bound either.
        let mut empty = client_hello(Some("a.test"), false)[..9].to_vec();
        empty[3..5].copy_from_slice(&4u16.to_be_bytes());
        while empty.len() <= MAX_HELLO + 4 * 1024 {
            empty.extend_from_slice(&[0x16, 3, 1, 0, 0]);
        }
        assert!(matches!(sniff(&empty), Sniffed::Refused(_)));
    }

    #[test]
    fn a_client_hello_interrupted_or_malformed_is_refused() {
        let ch = client_hello(Some("a.test"), false);
        let hs = &ch[5..];
        let mut two = vec![0x16, 3, 1, 0, 10];
        two.extend_from_slice(&hs[..10]);
        two.extend_from_slice(&[0x17, 3, 3, 0, 1, 0]);
        assert!(matches!(sniff(&two), Sniffed::Refused(_)));
        let mut bad = ch.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0xff; // the SNI list no longer adds up
        bad.truncate(bad.len() - 3);
        let hs_len = bad.len() - 9;
        bad[3..5].copy_from_slice(&((hs_len + 4) as u16).to_be_bytes());
        bad[6..9].copy_from_slice(&(hs_len as u32).to_be_bytes()[1..]);
        assert!(matches!(sniff(&bad), Sniffed::Refused(_)));
    }

    #[test]
    fn bare_lf_and_leading_empty_lines_are_read_as_http() {
        let r = b"GET / HTTP/1.1\nHost: allowed.test\n\nbody";
        assert_eq!(
            sniff(r),
            Sniffed::Http {
                host: "allowed.test".into(),
                header_end: r.len() - 4
            }
        );
        let r = b"\r\n\r\nGET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n";
        assert!(matches!(sniff(r), Sniffed::Http { host, .. } if host == "allowed.test"));
        assert_eq!(sniff(b"\r\n"), Sniffed::NeedMore);
        assert_eq!(sniff(b"\r\nGE"), Sniffed::NeedMore);
        let r = b"GET\t/\tHTTP/1.1\nHost: allowed.test\r\n\n";
        assert!(matches!(sniff(r), Sniffed::Http { host, .. } if host == "allowed.test"));
        // Begun like HTTP but unreadable: refused, not passed on unnamed.
        assert!(matches!(
            sniff(b"GET /\r\nHost: allowed.test\r\n\r\n"),
            Sniffed::Refused(_)
        ));
        assert!(matches!(
            sniff(b"GET / HTTP/1.1\r\nX: y\r\n Host: allowed.test\r\n\r\n"),
            Sniffed::Refused(_)
        ));
        let mut big = b"GET / HTTP/1.1\r\nX: ".to_vec();
        big.resize(MAX_PEEK, b'a');
        assert!(matches!(sniff(&big), Sniffed::Refused(_)));
        // Not HTTP: an uppercase word not followed by a space.
        assert_eq!(sniff(b"SSH-2.0-OpenSSH_9\r\n"), Sniffed::Unknown);
    }

    #[test]
    fn a_bare_lf_request_is_forwarded_with_crlf_and_connection_close() {
        let r = b"\r\nGET / HTTP/1.1\nHost: a.test\nConnection: keep-alive\n\nrest";
        let Sniffed::Http { header_end, .. } = sniff(r) else {
            panic!()
        };
        let out = String::from_utf8(force_connection_close(r, header_end)).unwrap();
        assert_eq!(
            out,
            "GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\nrest"
        );
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
            Sniffed::Refused(_)
        ));
        assert!(matches!(
            sniff(b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n"),
            Sniffed::Refused(_)
        ));
        assert!(matches!(
            sniff(b"CONNECT denied.test:443 HTTP/1.1\r\nHost: denied.test\r\n\r\n"),
            Sniffed::Refused(_)
        ));
        assert!(matches!(
            sniff(b"GET http://denied.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n"),
            Sniffed::Refused(_)
        ));
        assert!(matches!(
            sniff(b"GET http://allowed.test:80/x HTTP/1.1\r\nHost: allowed.test\r\n\r\n"),
            Sniffed::Http { .. }
        ));
        for bad in ["[::1]\x1bjunk", "[::1]:8x", "[nonsense]", "[::1"] {
            let r = format!("GET / HTTP/1.1\r\nHost: {bad}\r\n\r\n");
            assert!(
                matches!(sniff(r.as_bytes()), Sniffed::Refused(_)),
                "{bad:?}"
            );
        }
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
    fn a_server_name_that_is_not_a_host_name_is_refused() {
        // A label longer than a DNS length byte can say: asked as it was, the
        // rest of the label became a question for another name.
        let forged = format!(
            "evil\x03com\x00\x00\x01\x00\x01{}.wild.test",
            "x".repeat(247)
        );
        for bad in [
            forged.as_str(),
            "a\x1b[2Jb.test",
            "a b.test",
            "a..test",
            &format!("{}.test", "a".repeat(64)),
            &["a".repeat(63).as_str(); 5].join("."),
        ] {
            assert!(
                matches!(sniff(&client_hello(Some(bad), false)), Sniffed::Refused(_)),
                "SNI {bad:?}"
            );
            let req = format!("GET / HTTP/1.1\r\nHost: {bad}\r\n\r\n");
            assert!(
                matches!(sniff(req.as_bytes()), Sniffed::Refused(_)),
                "Host {bad:?}"
            );
        }
        // Not UTF-8: refused too, not read as some other name.
        let mut ch = client_hello(Some("a\u{e9}.test"), false);
        let at = ch
            .windows(2)
            .position(|w| w == "\u{e9}".as_bytes())
            .unwrap();
        ch[at] = 0xff;
        assert!(matches!(sniff(&ch), Sniffed::Refused(_)));
        // Host names with underscores, digits and a trailing dot are fine.
        assert_eq!(
            sniff(&client_hello(Some("_srv.a-1.test."), false)),
            Sniffed::Tls {
                sni: "_srv.a-1.test.".into(),
                ech: false
            }
        );
    }

    #[test]
    fn an_absolute_uri_of_any_scheme_must_name_the_host() {
        for target in [
            "ws://denied.test/",
            "WSS://denied.test:443/x",
            "ftp://u@denied.test/",
        ] {
            let req = format!("GET {target} HTTP/1.1\r\nHost: allowed.test\r\n\r\n");
            assert!(
                matches!(sniff(req.as_bytes()), Sniffed::Refused(_)),
                "{target}"
            );
        }
        let ok = b"GET ws://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n";
        assert!(matches!(sniff(ok), Sniffed::Http { .. }));
        // A path that merely contains "://" is not an absolute URI.
        let path = b"GET /r?u=http://x.test HTTP/1.1\r\nHost: allowed.test\r\n\r\n";
        assert!(matches!(sniff(path), Sniffed::Http { .. }));
    }

    #[test]
    fn a_lowercase_method_is_read_as_http_when_its_line_ends_in_a_version() {
        let r = b"get / HTTP/1.1\r\nHost: Denied.Test\r\n\r\n";
        assert_eq!(
            sniff(r),
            Sniffed::Http {
                host: "denied.test".into(),
                header_end: r.len()
            }
        );
        let r = b"Get / http/1.1\r\nHost: denied.test\r\n\r\n";
        assert!(matches!(sniff(r), Sniffed::Http { .. }));
        assert!(matches!(
            sniff(b"connect denied.test:443 HTTP/1.1\r\nHost: denied.test\r\n\r\n"),
            Sniffed::Refused(_)
        ));
        // Lowercase text protocols stay unnamed.
        assert_eq!(sniff(b"get key\r\n"), Sniffed::Unknown);
        assert_eq!(sniff(b"set key 0 0 1\r\nx\r\n"), Sniffed::Unknown);
        assert_eq!(sniff(b"get / HTTP/1."), Sniffed::NeedMore);
        // Any token is a method to some server: a long one, one with a dash.
        let long = format!(
            "{} / HTTP/1.1\r\nHost: denied.test\r\n\r\n",
            "GET".repeat(10)
        );
        assert!(matches!(sniff(long.as_bytes()), Sniffed::Http { .. }));
        let r = b"M-SEARCH * HTTP/1.1\r\nHost: denied.test\r\n\r\n";
        assert!(matches!(sniff(r), Sniffed::Http { .. }));
        // A request line that has not ended at the bound could be one: refused,
        // never passed on unnamed.
        let open_line = format!("get /{}", "a".repeat(MAX_PEEK));
        assert!(matches!(sniff(open_line.as_bytes()), Sniffed::Refused(_)));
        let open_token = "g".repeat(MAX_PEEK + 1);
        assert!(matches!(sniff(open_token.as_bytes()), Sniffed::Refused(_)));
        // Bytes that are no token stay unnamed at once.
        assert_eq!(sniff(b"get\x00key"), Sniffed::Unknown);
        // Separators and leading space some servers take: read as HTTP, and a
        // request line the proxy cannot parse as servers do is refused.
        let vt = b"GET\x0b/\x0bHTTP/1.1\r\nHost: denied.test\r\n\r\n";
        assert!(matches!(sniff(vt), Sniffed::Refused(_)));
        let r = b" GET / HTTP/1.1\r\nHost: Denied.Test\r\n\r\n";
        assert!(matches!(sniff(r), Sniffed::Http { ref host, .. } if host == "denied.test"));
        for sep in [b'\x1c', b'\x1f', 0x85, 0xa0] {
            let mut r = b"GET".to_vec();
            r.push(sep);
            r.extend_from_slice(b"/ HTTP/1.1\r\nHost: denied.test\r\n\r\n");
            assert!(matches!(sniff(&r), Sniffed::Refused(_)), "{sep:#x}");
            let mut lead = vec![sep];
            lead.extend_from_slice(b"GET / HTTP/1.1\r\nHost: denied.test\r\n\r\n");
            assert!(
                !matches!(sniff(&lead), Sniffed::Unknown),
                "leading {sep:#x}"
            );
        }
        // A method that starts with a digit is a token too.
        let r = b"1X / HTTP/1.1\r\nHost: denied.test\r\n\r\n";
        assert!(matches!(sniff(r), Sniffed::Http { .. }));
        // A bare CR could end a header line at the server: refused.
        let r = b"GET / HTTP/1.1\r\nX: a\rHost: denied.test\r\nHost: allowed.test\r\n\r\n";
        assert!(matches!(sniff(r), Sniffed::Refused(_)));
        let r = b"GET / HTTP/1.1\r\nX: a\0b\r\nHost: allowed.test\r\n\r\n";
        assert!(matches!(sniff(r), Sniffed::Refused(_)));
        // Binary protocols whose first byte is a token character stay unnamed.
        assert_eq!(sniff(b"A\x01\x00\x00\xd4\x07"), Sniffed::Unknown);
        assert_eq!(sniff(b"*1\r\n$4\r\nPING\r\n"), Sniffed::Unknown);
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
