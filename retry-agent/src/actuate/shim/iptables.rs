//! Steering: nat-table chains that REDIRECT selected TCP connections to the shim.
//!
//! Layout (per family, iptables and ip6tables):
//! - `OUTPUT -p tcp -j <chain>` (inserted first, once): outbound traffic of local workloads.
//!   In `<chain>`: packets carrying the shim's mark RETURN (its own upstream connections), the
//!   shim's own port RETURNs (no loops), then one REDIRECT per selector combination
//!   (uid × cgroup × destination port; AND across kinds, OR within a kind).
//! - `PREROUTING -p tcp -j <chain>_IN` (only with inbound ports): traffic arriving for local
//!   services (from pods / other hosts), redirected by destination port. Not limited to the
//!   host's own addresses (`-m addrtype --dst-type LOCAL`): a node's pods sit behind veths and
//!   bridges, so traffic for them is routed by the host, and that is exactly what the shim must
//!   see (the lab's chains fail without it). Limiting it to this node's pod addresses is open.
//! - Every iptables call waits at most [`LOCK_WAIT_SECS`] for the xtables lock (`-w 5`), so
//!   a stuck holder (another agent, kube-proxy) fails the call instead of hanging the shim.
//!
//! Install is idempotent: chains are created if missing and flushed before refilling, jump rules
//! are checked (`-C`) before insertion, so a restart never duplicates rules. Removal deletes every
//! copy of the jump rules, then flushes and deletes the chains; a missing piece is not an error.
use std::process::Command;

/// Seconds an iptables call waits for the xtables lock before failing.
pub const LOCK_WAIT_SECS: u32 = 5;

/// `iptables -w <secs>` with the arguments that follow.
fn iptables(fam: Family) -> Command {
    let mut c = Command::new(fam.bin());
    c.args(["-w", &LOCK_WAIT_SECS.to_string()]);
    c
}

#[derive(Debug, thiserror::Error)]
pub enum SteerError {
    #[error("running {bin}: {source}")]
    Spawn {
        bin: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("`{bin} {args}` failed: {stderr}")]
    Failed {
        bin: &'static str,
        args: String,
        stderr: String,
    },
    #[error("chain name {0:?} must be 1-24 characters of [A-Za-z0-9_-]")]
    BadChain(String),
    #[error(
        "no selector: give at least one --shim-uid, --shim-cgroup, --shim-dport or --shim-inbound-port"
    )]
    NoSelector,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn bin(self) -> &'static str {
        match self {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        }
    }

    /// Whether this family's nat table can be used here.
    pub fn available(self) -> bool {
        iptables(self)
            .args(["-t", "nat", "-S", "OUTPUT"])
            .output()
            .is_ok_and(|o| o.status.success())
    }
}

#[derive(Clone, Debug, Default)]
pub struct Steering {
    pub chain: String,
    pub listen_port: u16,
    pub mark: u32,
    pub uids: Vec<u32>,
    pub cgroups: Vec<String>,
    pub dports: Vec<u16>,
    pub inbound_ports: Vec<u16>,
    /// Inbound steering only for these destinations (this node's pod addresses): traffic the
    /// node merely routes elsewhere is left alone. Empty: every destination.
    pub inbound_dsts: Vec<Cidr>,
}

/// An address block, `10.244.3.0/24` or `fd00::/64` (a bare address is a /32 or /128).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    pub addr: std::net::IpAddr,
    pub prefix: u8,
}

impl Cidr {
    fn family(&self) -> Family {
        if self.addr.is_ipv4() {
            Family::V4
        } else {
            Family::V6
        }
    }
}

impl std::str::FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (a, p) = s.split_once('/').unwrap_or((s, ""));
        let addr: std::net::IpAddr = a
            .parse()
            .map_err(|_| format!("{s}: not an address block (want a.b.c.d/n or x::/n)"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = if p.is_empty() {
            max
        } else {
            p.parse::<u8>()
                .ok()
                .filter(|&n| n <= max)
                .ok_or_else(|| format!("{s}: the prefix length must be 0..={max}"))?
        };
        Ok(Cidr { addr, prefix })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

pub fn valid_chain(c: &str) -> bool {
    // 28 is the kernel limit; `_IN` is appended for the inbound chain.
    (1..=24).contains(&c.len())
        && c.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

pub fn inbound_chain(chain: &str) -> String {
    format!("{chain}_IN")
}

fn run(fam: Family, args: &[String]) -> Result<(), SteerError> {
    let out = iptables(fam)
        .args(args)
        .output()
        .map_err(|source| SteerError::Spawn {
            bin: fam.bin(),
            source,
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(SteerError::Failed {
            bin: fam.bin(),
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

impl Steering {
    pub fn validate(&self) -> Result<(), SteerError> {
        if !valid_chain(&self.chain) {
            return Err(SteerError::BadChain(self.chain.clone()));
        }
        if self.uids.is_empty()
            && self.cgroups.is_empty()
            && self.dports.is_empty()
            && self.inbound_ports.is_empty()
        {
            return Err(SteerError::NoSelector);
        }
        Ok(())
    }

    /// Rules of the outbound chain, in order (arguments after `-A <chain>`).
    pub fn outbound_rules(&self) -> Vec<Vec<String>> {
        let port = self.listen_port.to_string();
        let mut rules = vec![
            s(&[
                "-m",
                "mark",
                "--mark",
                &format!("{:#x}", self.mark),
                "-j",
                "RETURN",
            ]),
            s(&["-p", "tcp", "--dport", &port, "-j", "RETURN"]),
        ];
        if self.uids.is_empty() && self.cgroups.is_empty() && self.dports.is_empty() {
            return rules; // inbound-only steering
        }
        let uids: Vec<Option<u32>> = if self.uids.is_empty() {
            vec![None]
        } else {
            self.uids.iter().copied().map(Some).collect()
        };
        let cgs: Vec<Option<&str>> = if self.cgroups.is_empty() {
            vec![None]
        } else {
            self.cgroups.iter().map(|c| Some(c.as_str())).collect()
        };
        let dps: Vec<Option<u16>> = if self.dports.is_empty() {
            vec![None]
        } else {
            self.dports.iter().copied().map(Some).collect()
        };
        for u in &uids {
            for c in &cgs {
                for d in &dps {
                    let mut r = s(&["-p", "tcp"]);
                    if let Some(u) = u {
                        r.extend(s(&["-m", "owner", "--uid-owner", &u.to_string()]));
                    }
                    if let Some(c) = c {
                        r.extend(s(&["-m", "cgroup", "--path", c]));
                    }
                    if let Some(d) = d {
                        r.extend(s(&["--dport", &d.to_string()]));
                    }
                    r.extend(s(&["-j", "REDIRECT", "--to-ports", &port]));
                    rules.push(r);
                }
            }
        }
        rules
    }

    /// Rules of the inbound chain for one family: each port, for each destination block of
    /// that family when blocks are given (none of that family: nothing of it is steered).
    pub fn inbound_rules(&self, fam: Family) -> Vec<Vec<String>> {
        let port = self.listen_port.to_string();
        let dsts: Vec<Option<String>> = if self.inbound_dsts.is_empty() {
            vec![None]
        } else {
            self.inbound_dsts
                .iter()
                .filter(|c| c.family() == fam)
                .map(|c| Some(c.to_string()))
                .collect()
        };
        let mut rules = Vec::new();
        for p in &self.inbound_ports {
            for d in &dsts {
                let mut r = s(&["-p", "tcp"]);
                if let Some(d) = d {
                    r.extend(s(&["-d", d]));
                }
                r.extend(s(&[
                    "--dport",
                    &p.to_string(),
                    "-j",
                    "REDIRECT",
                    "--to-ports",
                    &port,
                ]));
                rules.push(r);
            }
        }
        rules
    }

    /// Installs (or re-installs) the chains and jump rules for one family.
    pub fn install(&self, fam: Family) -> Result<(), SteerError> {
        self.validate()?;
        let inb = inbound_chain(&self.chain);
        fill_chain(fam, &self.chain, &self.outbound_rules())?;
        ensure_jump(fam, "OUTPUT", &self.chain)?;
        if self.inbound_ports.is_empty() {
            remove_chain(fam, "PREROUTING", &inb);
        } else {
            fill_chain(fam, &inb, &self.inbound_rules(fam))?;
            ensure_jump(fam, "PREROUTING", &inb)?;
        }
        Ok(())
    }
}

fn fill_chain(fam: Family, chain: &str, rules: &[Vec<String>]) -> Result<(), SteerError> {
    // -N fails when the chain exists: that is the idempotent case, so only -F must succeed.
    let _ = run(fam, &s(&["-t", "nat", "-N", chain]));
    run(fam, &s(&["-t", "nat", "-F", chain]))?;
    for r in rules {
        let mut a = s(&["-t", "nat", "-A", chain]);
        a.extend(r.iter().cloned());
        run(fam, &a)?;
    }
    Ok(())
}

fn jump(op: &str, hook: &str, chain: &str) -> Vec<String> {
    let mut a = s(&["-t", "nat", op, hook]);
    if op == "-I" {
        a.push("1".into());
    }
    a.extend(s(&["-p", "tcp", "-j", chain]));
    a
}

fn ensure_jump(fam: Family, hook: &str, chain: &str) -> Result<(), SteerError> {
    if run(fam, &jump("-C", hook, chain)).is_ok() {
        return Ok(());
    }
    run(fam, &jump("-I", hook, chain))
}

/// Deletes every jump to `chain` from `hook`, then the chain. Best effort; returns whether
/// anything was found.
fn remove_chain(fam: Family, hook: &str, chain: &str) -> bool {
    let mut found = false;
    // Bounded: a rule is deleted per iteration, and nobody should have inserted 100 copies.
    for _ in 0..100 {
        if run(fam, &jump("-D", hook, chain)).is_err() {
            break;
        }
        found = true;
    }
    if run(fam, &s(&["-t", "nat", "-F", chain])).is_ok() {
        found = true;
    }
    let _ = run(fam, &s(&["-t", "nat", "-X", chain]));
    found
}

/// Removes everything `install` may have left for `chain`, in both families. Idempotent.
pub fn cleanup(chain: &str) -> Result<bool, SteerError> {
    if !valid_chain(chain) {
        return Err(SteerError::BadChain(chain.to_string()));
    }
    let mut found = false;
    for fam in [Family::V4, Family::V6] {
        if Command::new(fam.bin()).arg("--version").output().is_err() {
            continue;
        }
        found |= remove_chain(fam, "OUTPUT", chain);
        found |= remove_chain(fam, "PREROUTING", &inbound_chain(chain));
    }
    Ok(found)
}

/// The current rules of `chain` (`iptables -S`), for tests and diagnostics.
pub fn list(fam: Family, chain: &str) -> Option<Vec<String>> {
    let out = iptables(fam)
        .args(["-t", "nat", "-S", chain])
        .output()
        .ok()?;
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    })
}

/// How many jump rules to `chain` `hook` holds (duplicates show up here).
pub fn count_jumps(fam: Family, hook: &str, chain: &str) -> usize {
    list(fam, hook).map_or(0, |l| {
        l.iter()
            .filter(|r| r.ends_with(&format!("-j {chain}")))
            .count()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_are_a_product_of_selectors_after_the_exclusions() {
        let st = Steering {
            chain: "RETRY_SHIM".into(),
            listen_port: 15001,
            mark: 0x52a0,
            uids: vec![1000, 1001],
            dports: vec![80],
            ..Default::default()
        };
        let r = st.outbound_rules();
        assert_eq!(r.len(), 4);
        assert_eq!(r[0].join(" "), "-m mark --mark 0x52a0 -j RETURN");
        assert_eq!(r[1].join(" "), "-p tcp --dport 15001 -j RETURN");
        assert_eq!(
            r[2].join(" "),
            "-p tcp -m owner --uid-owner 1000 --dport 80 -j REDIRECT --to-ports 15001"
        );
        assert_eq!(
            r[3].join(" "),
            "-p tcp -m owner --uid-owner 1001 --dport 80 -j REDIRECT --to-ports 15001"
        );
        assert!(st.validate().is_ok());
    }

    #[test]
    fn validation() {
        assert!(!valid_chain("A_VERY_LONG_CHAIN_NAME_OVER_24"));
        assert!(!valid_chain("bad chain"));
        assert!(valid_chain("RASHIM_1"));
        let st = Steering {
            chain: "X".into(),
            ..Default::default()
        };
        assert!(matches!(st.validate(), Err(SteerError::NoSelector)));
        let st = Steering {
            chain: "X".into(),
            inbound_ports: vec![8080],
            listen_port: 1,
            ..Default::default()
        };
        assert_eq!(st.outbound_rules().len(), 2);
        assert_eq!(
            st.inbound_rules(Family::V4)[0].join(" "),
            "-p tcp --dport 8080 -j REDIRECT --to-ports 1"
        );
    }

    /// Inbound steering limited to this node's pod blocks: one rule per port and block of the
    /// family; a family without a block steers nothing (routed traffic is left alone).
    #[test]
    fn inbound_rules_only_for_the_given_destinations() {
        let st = Steering {
            chain: "X".into(),
            inbound_ports: vec![8080, 9090],
            listen_port: 1,
            inbound_dsts: vec!["10.244.3.0/24".parse().unwrap()],
            ..Default::default()
        };
        let v4: Vec<String> = st
            .inbound_rules(Family::V4)
            .iter()
            .map(|r| r.join(" "))
            .collect();
        assert_eq!(
            v4,
            [
                "-p tcp -d 10.244.3.0/24 --dport 8080 -j REDIRECT --to-ports 1",
                "-p tcp -d 10.244.3.0/24 --dport 9090 -j REDIRECT --to-ports 1"
            ]
        );
        assert!(st.inbound_rules(Family::V6).is_empty());
        assert_eq!(
            "fd00::/64".parse::<Cidr>().unwrap().to_string(),
            "fd00::/64"
        );
        assert_eq!(
            "10.0.0.7".parse::<Cidr>().unwrap().to_string(),
            "10.0.0.7/32"
        );
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("pods".parse::<Cidr>().is_err());
    }
}
