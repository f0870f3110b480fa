//! Helpers the root-only two-process tests share: the root check, a namespace pair that is
//! removed even when a test fails, and reading a `--json` summary.
#![allow(dead_code, unreachable_pub)]

use std::process::{Command, Output};

use serde_json::Value;

/// True when running as root with iproute2; otherwise says the test is skipped and why.
pub fn root(what: &str) -> bool {
    let ok = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout == b"0\n")
        && Command::new("ip").arg("-V").output().is_ok();
    if !ok {
        eprintln!("skipped: needs root and iproute2 ({what})");
    }
    ok
}

/// Namespaces `PREFIX-a` and `PREFIX-b` joined by a veth pair (scripts/netns-pair.sh),
/// removed on drop.
pub struct Pair(String);

impl Pair {
    pub fn up(prefix: &str) -> Self {
        let _ = Command::new(SCRIPT).args(["down", prefix]).output();
        let out = Command::new(SCRIPT).args(["up", prefix]).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self(prefix.into())
    }

    /// `(namespace, afpacket device)` of the `a` and `b` ends.
    #[allow(dead_code)] // not every test binary that shares this module uses it
    pub fn afpacket_ends(&self) -> [(String, String); 2] {
        let p = &self.0;
        let short = &p[..p.len().min(8)];
        ["a", "b"].map(|end| (format!("{p}-{end}"), format!("afpacket:{short}-v{end}")))
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _ = Command::new(SCRIPT).args(["down", &self.0]).output();
    }
}

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/netns-pair.sh");

/// The JSON object a `--json` run printed, or a panic showing what it printed instead.
pub fn json_of(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "{e}: stdout {text} stderr {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}
