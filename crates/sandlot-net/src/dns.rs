//! The DNS wire format, as far as the resolver needs it: parse a query's question,
//! build refusals, build an A query, read A records from an answer. Pure.

use std::net::Ipv4Addr;

/// Record types the resolver treats specially.
pub mod qtype {
    pub const A: u16 = 1;
    pub const TXT: u16 = 16;
    pub const AAAA: u16 = 28;
    /// SVCB and HTTPS carry Encrypted Client Hello keys: never passed on.
    pub const SVCB: u16 = 64;
    pub const HTTPS: u16 = 65;
}

/// Response codes.
pub mod rcode {
    pub const NOERROR: u8 = 0;
    pub const FORMERR: u8 = 1;
    pub const SERVFAIL: u8 = 2;
    pub const NXDOMAIN: u8 = 3;
    pub const REFUSED: u8 = 5;
}

/// The question of a query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub id: u16,
    /// Lowercase, dot-separated, no trailing dot (`""` for the root).
    pub name: String,
    pub qtype: u16,
    /// Offset just past the question section.
    pub question_end: usize,
    /// Recursion desired.
    pub rd: bool,
}

/// Why a message is not a query the resolver answers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("dns message shorter than its header")]
    Short,
    #[error("dns message is a response, not a query")]
    NotQuery,
    #[error("dns opcode {0} is not QUERY")]
    Opcode(u8),
    #[error("dns query has {0} questions (one expected)")]
    Questions(u16),
    #[error("dns name is malformed")]
    BadName,
}

/// Parses a query's single question.
pub fn parse_query(b: &[u8]) -> Result<Query, WireError> {
    if b.len() < 12 {
        return Err(WireError::Short);
    }
    if b[2] & 0x80 != 0 {
        return Err(WireError::NotQuery);
    }
    let opcode = (b[2] >> 3) & 0x0f;
    if opcode != 0 {
        return Err(WireError::Opcode(opcode));
    }
    let qd = u16::from_be_bytes([b[4], b[5]]);
    if qd != 1 {
        return Err(WireError::Questions(qd));
    }
    let mut i = 12;
    let mut labels = Vec::new();
    let mut total = 0;
    loop {
        let len = *b.get(i).ok_or(WireError::BadName)? as usize;
        i += 1;
        if len == 0 {
            break;
        }
        // Compression pointers have no place in a question.
        if len > 63 {
            return Err(WireError::BadName);
        }
        let l = b.get(i..i + len).ok_or(WireError::BadName)?;
        total += len + 1;
        if total > 255 {
            return Err(WireError::BadName);
        }
        let s = std::str::from_utf8(l).map_err(|_| WireError::BadName)?;
        if s.contains('.') {
            return Err(WireError::BadName);
        }
        labels.push(s.to_ascii_lowercase());
        i += len;
    }
    let t = b.get(i..i + 4).ok_or(WireError::BadName)?;
    Ok(Query {
        id: u16::from_be_bytes([b[0], b[1]]),
        name: labels.join("."),
        qtype: u16::from_be_bytes([t[0], t[1]]),
        question_end: i + 4,
        rd: b[2] & 1 != 0,
    })
}

/// An answer with no records and `code`, echoing the question.
pub fn empty_response(query: &[u8], q: &Query, code: u8) -> Vec<u8> {
    let mut r = Vec::with_capacity(q.question_end);
    r.extend_from_slice(&q.id.to_be_bytes());
    r.push(0x80 | u8::from(q.rd)); // QR, opcode 0, RD echoed
    r.push(0x80 | (code & 0x0f)); // RA, rcode
    r.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
    r.extend_from_slice(&query[12..q.question_end]);
    r
}

/// A FORMERR answer to a message that could not be parsed (header only).
pub fn formerr(query: &[u8]) -> Option<Vec<u8>> {
    if query.len() < 2 {
        return None;
    }
    let mut r = vec![query[0], query[1], 0x80, 0x80 | rcode::FORMERR];
    r.extend_from_slice(&[0; 8]);
    Some(r)
}

/// A recursive query for `name`/`qtype`; a name whose labels a DNS question
/// cannot carry as they are (empty, over 63 bytes, over 255 in all) is refused,
/// never cut to fit.
pub fn build_query(id: u16, name: &str, qtype: u16) -> Result<Vec<u8>, WireError> {
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() || name.len() > 253 {
        return Err(WireError::BadName);
    }
    for l in name.split('.') {
        if l.is_empty() || l.len() > 63 {
            return Err(WireError::BadName);
        }
        q.push(l.len() as u8);
        q.extend_from_slice(l.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&1u16.to_be_bytes());
    Ok(q)
}

/// Skips a possibly compressed name; returns the offset after it.
fn skip_name(b: &[u8], mut i: usize) -> Option<usize> {
    loop {
        let len = *b.get(i)? as usize;
        if len == 0 {
            return Some(i + 1);
        }
        if len & 0xc0 == 0xc0 {
            return Some(i + 2);
        }
        i += 1 + len;
    }
}

/// The response code and the A records of an answer to `query` (from
/// [`build_query`]): its id and its question (the name compared without regard to
/// case) must be the query's, or it answers something else.
pub fn parse_a_answer(b: &[u8], query: &[u8]) -> Option<(u8, Vec<Ipv4Addr>)> {
    if b.len() < 12 || query.len() < 12 || b[..2] != query[..2] || b[2] & 0x80 == 0 {
        return None;
    }
    let code = b[3] & 0x0f;
    let qd = u16::from_be_bytes([b[4], b[5]]);
    let an = u16::from_be_bytes([b[6], b[7]]);
    // Some servers leave the question out of an error answer (REFUSED, FORMERR):
    // its code is still what the lookup got.
    if qd == 0 && code != 0 && an == 0 {
        return Some((code, Vec::new()));
    }
    let question = &query[12..];
    if qd != 1
        || !b
            .get(12..12 + question.len())?
            .eq_ignore_ascii_case(question)
    {
        return None;
    }
    let mut i = 12 + question.len();
    let mut out = Vec::new();
    for _ in 0..an {
        i = skip_name(b, i)?;
        let h = b.get(i..i + 10)?;
        let ty = u16::from_be_bytes([h[0], h[1]]);
        let len = u16::from_be_bytes([h[8], h[9]]) as usize;
        let data = b.get(i + 10..i + 10 + len)?;
        if ty == qtype::A && len == 4 {
            out.push(Ipv4Addr::new(data[0], data[1], data[2], data[3]));
        }
        i += 10 + len;
    }
    Some((code, out))
}

/// Human name of a record type for the audit log.
pub fn qtype_name(t: u16) -> String {
    match t {
        1 => "A".into(),
        2 => "NS".into(),
        5 => "CNAME".into(),
        6 => "SOA".into(),
        12 => "PTR".into(),
        15 => "MX".into(),
        16 => "TXT".into(),
        28 => "AAAA".into(),
        33 => "SRV".into(),
        64 => "SVCB".into(),
        65 => "HTTPS".into(),
        255 => "ANY".into(),
        n => format!("TYPE{n}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_round_trip() {
        let q = build_query(0x1234, "Allowed.Test", qtype::A).unwrap();
        let p = parse_query(&q).unwrap();
        assert_eq!(p.id, 0x1234);
        assert_eq!(p.name, "allowed.test");
        assert_eq!(p.qtype, qtype::A);
        assert_eq!(p.question_end, q.len());
        assert!(p.rd);
    }

    #[test]
    fn refusals_echo_the_question() {
        let q = build_query(7, "denied.test", qtype::TXT).unwrap();
        let p = parse_query(&q).unwrap();
        let r = empty_response(&q, &p, rcode::NXDOMAIN);
        assert_eq!(&r[..2], &[0, 7]);
        assert_eq!(r[3] & 0x0f, rcode::NXDOMAIN);
        assert_eq!(r[2] & 0x80, 0x80);
        assert_eq!(&r[12..], &q[12..]);
        assert_eq!(parse_a_answer(&r, &q), Some((rcode::NXDOMAIN, vec![])));
    }

    #[test]
    fn malformed_queries_are_rejected() {
        assert_eq!(parse_query(&[0; 5]), Err(WireError::Short));
        let mut q = build_query(1, "a.test", 1).unwrap();
        q[2] |= 0x80;
        assert_eq!(parse_query(&q), Err(WireError::NotQuery));
        let mut q = build_query(1, "a.test", 1).unwrap();
        q[5] = 2;
        assert_eq!(parse_query(&q), Err(WireError::Questions(2)));
        let mut q = build_query(1, "a.test", 1).unwrap();
        q[12] = 0xc0;
        assert_eq!(parse_query(&q), Err(WireError::BadName));
        let q = build_query(1, "a.test", 1).unwrap();
        assert_eq!(parse_query(&q[..q.len() - 2]), Err(WireError::BadName));
    }

    #[test]
    fn a_records_are_read_through_compression() {
        let q = build_query(9, "x.test", qtype::A).unwrap();
        let mut r = q.clone();
        r[2] = 0x81;
        r[3] = 0x80;
        r[7] = 2; // two answers
        for ip in [[10, 0, 0, 1], [10, 0, 0, 2]] {
            r.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
            r.extend_from_slice(&ip);
        }
        assert_eq!(
            parse_a_answer(&r, &q),
            Some((
                0,
                vec![Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)]
            ))
        );
        let mut other_id = q.clone();
        other_id[1] = 10;
        assert_eq!(parse_a_answer(&r, &other_id), None);
        // The same answer to a query for another name is no answer to it.
        let y = build_query(9, "y.test", qtype::A).unwrap();
        assert_eq!(parse_a_answer(&r, &y), None);
        // The name's case is not compared (resolvers may echo it changed).
        let upper = build_query(9, "X.TEST", qtype::A).unwrap();
        assert_eq!(parse_a_answer(&r, &upper).map(|a| a.1.len()), Some(2));
        // An error answer without its question still gives its code; a success
        // without one answers nothing asked.
        let mut refused = r[..12].to_vec();
        refused[3] = 0x85;
        refused[5] = 0;
        refused[7] = 0;
        assert_eq!(parse_a_answer(&refused, &q), Some((5, vec![])));
        refused[3] = 0x80;
        assert_eq!(parse_a_answer(&refused, &q), None);
    }

    #[test]
    fn a_name_a_question_cannot_carry_is_refused_not_cut() {
        // A 260-byte label would have been written with the length byte 4,
        // turning the rest of the label into a question of its own.
        let forged = format!("evil{}.wild.test", "x".repeat(256));
        assert_eq!(build_query(1, &forged, qtype::A), Err(WireError::BadName));
        assert_eq!(
            build_query(1, &format!("{}.test", "a".repeat(64)), qtype::A),
            Err(WireError::BadName)
        );
        assert_eq!(build_query(1, "a..test", qtype::A), Err(WireError::BadName));
        assert_eq!(build_query(1, "", qtype::A), Err(WireError::BadName));
        let long = ["a".repeat(63).as_str(); 4].join(".");
        assert_eq!(build_query(1, &long, qtype::A), Err(WireError::BadName));
        // 63-byte labels and a trailing dot are fine.
        let q = build_query(1, &format!("{}.test.", "a".repeat(63)), qtype::A).unwrap();
        assert_eq!(
            parse_query(&q).unwrap().name,
            format!("{}.test", "a".repeat(63))
        );
    }
}
