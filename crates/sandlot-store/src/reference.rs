//! Image names: `NAME[:TAG]` (tag `latest` when absent), with an optional registry
//! host (`host:5000/team/app:1.0`). Images are also addressed by id.

use std::fmt;

/// A tagged image name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ImageName {
    /// Repository, including any registry host (`team/app`, `127.0.0.1:5000/app`).
    pub repo: String,
    pub tag: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid image name {name:?}: {problem}")]
pub struct BadName {
    pub name: String,
    pub problem: &'static str,
}

impl ImageName {
    pub fn parse(s: &str) -> Result<ImageName, BadName> {
        let bad = |problem| BadName {
            name: s.to_string(),
            problem,
        };
        if s.is_empty() || s.len() > 255 {
            return Err(bad("use 1 to 255 characters"));
        }
        let slash = s.rfind('/').map_or(0, |i| i + 1);
        let (repo, tag) = match s[slash..].rfind(':') {
            Some(i) => (&s[..slash + i], &s[slash + i + 1..]),
            None => (s, "latest"),
        };
        if repo.is_empty() {
            return Err(bad("the repository part is empty"));
        }
        if tag.is_empty()
            || tag.len() > 128
            || !tag
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
            || tag.starts_with(['.', '-'])
        {
            return Err(bad("tags are 1 to 128 letters, digits, '_', '.' or '-'"));
        }
        let mut parts = repo.split('/').peekable();
        let mut first = true;
        while let Some(p) = parts.next() {
            // The first component may be a registry host with a port.
            let host_like =
                first && parts.peek().is_some() && (p.contains(['.', ':']) || p == "localhost");
            let ok = !p.is_empty()
                && if host_like {
                    p.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-.:".contains(&b))
                } else {
                    p.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b)
                    }) && p.starts_with(|c: char| c.is_ascii_alphanumeric())
                };
            if !ok {
                return Err(bad(
                    "repository components are lowercase letters, digits, '_', '.' or '-'",
                ));
            }
            first = false;
        }
        if s.starts_with("sha256:") {
            return Err(bad("looks like an image id, not a name"));
        }
        Ok(ImageName {
            repo: repo.to_string(),
            tag: tag.to_string(),
        })
    }

    /// The registry host, if the first component names one.
    pub fn registry(&self) -> Option<&str> {
        let (first, rest) = self.repo.split_once('/')?;
        (!rest.is_empty() && (first.contains(['.', ':']) || first == "localhost")).then_some(first)
    }

    /// The repository path on its registry.
    pub fn path(&self) -> &str {
        match self.registry() {
            Some(r) => &self.repo[r.len() + 1..],
            None => &self.repo,
        }
    }
}

impl fmt::Display for ImageName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.repo, self.tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse() {
        let n = ImageName::parse("debian").unwrap();
        assert_eq!(n.to_string(), "debian:latest");
        let n = ImageName::parse("127.0.0.1:5000/team/app:1.0").unwrap();
        assert_eq!(n.registry(), Some("127.0.0.1:5000"));
        assert_eq!(n.path(), "team/app");
        assert_eq!(n.tag, "1.0");
        assert_eq!(ImageName::parse("a/b").unwrap().registry(), None);
        for bad in ["", "Upper", "a:", "a:b c", "/x", "x//y", "sha256:abc", ":t"] {
            assert!(ImageName::parse(bad).is_err(), "{bad}");
        }
    }
}
