//! Decision-log actuator: every decision (and claim set) as one JSON line, appended to a file.
//! The audit trail of what the agent told the network to do.
use std::{
    fs::{File, OpenOptions},
    io::Write,
    path::{Path, PathBuf},
};

use serde::Serialize;

use super::{ActuateError, ActuateFuture, Actuator, ServiceClaim, control::unix_ms};
use crate::decide::Decision;

pub const DEFAULT_PATH: &str = "/run/retry-agent/decisions.jsonl";

pub struct DecisionLog {
    path: PathBuf,
    file: File,
}

/// One line of the log.
#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LogLine<'a> {
    Decision {
        logged_unix_ms: u64,
        decision: &'a Decision,
    },
    Claims {
        logged_unix_ms: u64,
        claims: &'a [ServiceClaim],
    },
}

impl DecisionLog {
    /// Opens (creating it and its directory) for appending.
    pub fn open(path: &Path) -> Result<DecisionLog, ActuateError> {
        let err = |source| ActuateError::DecisionLog {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(err)?;
        Ok(DecisionLog {
            path: path.to_path_buf(),
            file,
        })
    }

    fn write(&mut self, lines: &[LogLine<'_>]) -> Result<(), ActuateError> {
        if lines.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::new();
        for l in lines {
            serde_json::to_writer(&mut buf, l).map_err(|source| ActuateError::Serialize {
                what: "decision log line",
                source,
            })?;
            buf.push(b'\n');
        }
        // One write per batch: O_APPEND keeps concurrent readers from seeing torn lines.
        self.file
            .write_all(&buf)
            .map_err(|source| ActuateError::DecisionLog {
                path: self.path.clone(),
                source,
            })
    }
}

impl Actuator for DecisionLog {
    fn name(&self) -> &'static str {
        "decision-log"
    }

    fn apply<'a>(&'a mut self, decisions: &'a [Decision]) -> ActuateFuture<'a> {
        let now = unix_ms();
        let lines: Vec<_> = decisions
            .iter()
            .map(|decision| LogLine::Decision {
                logged_unix_ms: now,
                decision,
            })
            .collect();
        let r = self.write(&lines);
        Box::pin(async move { r })
    }

    fn publish_claims<'a>(&'a mut self, claims: &'a [ServiceClaim]) -> ActuateFuture<'a> {
        let r = self.write(&[LogLine::Claims {
            logged_unix_ms: unix_ms(),
            claims,
        }]);
        Box::pin(async move { r })
    }
}
