//! What stands between a sandbox's code and the host kernel.

use serde::{Deserialize, Serialize};

/// The isolation of a sandbox, weakest first (an operator's ceiling compares
/// them in this order).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// Linux namespaces, cgroups, seccomp and Landlock: the sandbox's processes
    /// make their system calls to the host kernel.
    #[default]
    Namespace,
    /// gVisor (`runsc`): a kernel in user space answers the sandbox's system
    /// calls; the host kernel sees only gVisor's own, filtered ones.
    Gvisor,
}

impl Isolation {
    pub const ALL: [Isolation; 2] = [Isolation::Namespace, Isolation::Gvisor];

    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Namespace => "namespace",
            Isolation::Gvisor => "gvisor",
        }
    }

    /// Parses `namespace` or `gvisor`.
    pub fn parse(s: &str) -> Option<Isolation> {
        Isolation::ALL.into_iter().find(|i| i.as_str() == s)
    }

    pub fn is_namespace(&self) -> bool {
        *self == Isolation::Namespace
    }
}

impl std::fmt::Display for Isolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn isolation_names_round_trip_and_order_by_strength() {
        for i in Isolation::ALL {
            assert_eq!(Isolation::parse(i.as_str()), Some(i));
            let json = serde_json::to_string(&i).unwrap();
            assert_eq!(json, format!("\"{i}\""));
        }
        assert_eq!(Isolation::parse("vm"), None);
        assert!(Isolation::Namespace < Isolation::Gvisor);
        let e = serde_json::from_str::<Isolation>("\"gVisor\"").unwrap_err();
        assert!(e.to_string().contains("namespace"), "{e}");
    }
}
