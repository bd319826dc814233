//! What happens to a sandbox when its idle or lifetime timeout passes, and
//! whether work sent to it while paused resumes it (`on_idle`, `on_timeout` and
//! `auto_resume` of the create body and of [`super::Sandbox`]).

use serde::{Deserialize, Serialize};
#[cfg(feature = "openapi")]
use utoipa::ToSchema;

/// What a timeout that passes does to a sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum OnExpiry {
    /// It ends (`end_reason` `timeout` or `idle_timeout`).
    #[default]
    Kill,
    /// It is paused, as `POST /v1/sandboxes/{id}/pause` would.
    Pause,
}

impl OnExpiry {
    pub fn as_str(self) -> &'static str {
        match self {
            OnExpiry::Kill => "kill",
            OnExpiry::Pause => "pause",
        }
    }

    /// The policy named by [`OnExpiry::as_str`].
    pub fn parse(s: &str) -> Option<OnExpiry> {
        match s {
            "kill" => Some(OnExpiry::Kill),
            "pause" => Some(OnExpiry::Pause),
            _ => None,
        }
    }
}

/// A sandbox's lifecycle policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Lifecycle {
    /// When its `idle_timeout` passes.
    #[serde(default)]
    pub on_idle: OnExpiry,
    /// When its lifetime `timeout` passes.
    #[serde(default)]
    pub on_timeout: OnExpiry,
    /// Exec, file, code and port calls on it while paused resume it first.
    #[serde(default)]
    pub auto_resume: bool,
}

impl Lifecycle {
    /// Today's behaviour: both timeouts end it, a paused sandbox answers 409.
    pub fn is_default(&self) -> bool {
        *self == Lifecycle::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_names_round_trip_and_unknown_names_are_refused() {
        for p in [OnExpiry::Kill, OnExpiry::Pause] {
            assert_eq!(OnExpiry::parse(p.as_str()), Some(p));
            let json = serde_json::to_value(p).unwrap();
            assert_eq!(json, serde_json::json!(p.as_str()));
        }
        assert_eq!(OnExpiry::parse("Pause"), None);
        assert_eq!(OnExpiry::parse("stop"), None);
        assert!(serde_json::from_value::<OnExpiry>(serde_json::json!("hibernate")).is_err());
    }

    #[test]
    fn missing_lifecycle_fields_mean_kill_without_auto_resume() {
        let l: Lifecycle = serde_json::from_value(serde_json::json!({})).unwrap();
        assert!(l.is_default());
        let l: Lifecycle =
            serde_json::from_value(serde_json::json!({"on_idle": "pause", "auto_resume": true}))
                .unwrap();
        assert_eq!(
            l,
            Lifecycle {
                on_idle: OnExpiry::Pause,
                on_timeout: OnExpiry::Kill,
                auto_resume: true
            }
        );
    }
}
