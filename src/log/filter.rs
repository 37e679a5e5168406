//! `IDEM_LOG`, parsed strictly: a filter that does not say what it means is refused.
//!
//! tracing-subscriber's own parser accepts junk: `debgu` is a *target* named `debgu` (every
//! level of it, nothing else: logging silently off), and a directive it cannot parse is
//! skipped with a warning or the whole variable replaced by the default. A typo must not
//! turn logging off on a production server, so every comma-separated directive must be one
//! of
//! - `LEVEL` (the default level),
//! - `TARGET=LEVEL` (a module path: `idem_org`, `idem_replica::ship`),
//! - `TARGET[SPAN{FIELD=VALUE,...}]=LEVEL` or `[SPAN]=LEVEL` (a span filter; the part in
//!   brackets must also parse as tracing's directive),
//!
//! where `LEVEL` is `off`, `error`, `warn`, `info`, `debug` or `trace` in any letter case
//! (no numbers: `3` reads as a level to tracing and as nothing to a person). Empty
//! directives (`info,`) are skipped.

use std::str::FromStr;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::Directive;

/// The levels a directive may name.
const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Parses `spec` (the value of `IDEM_LOG`) by the rules of this module.
///
/// # Errors
/// One line naming the first directive that breaks a rule.
pub(crate) fn parse(spec: &str) -> Result<EnvFilter, String> {
    let mut kept = Vec::new();
    for d in spec.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        check(d).map_err(|why| {
            format!(
                "IDEM_LOG: {d:?} {why} (each directive is LEVEL, TARGET=LEVEL or \
                 TARGET[SPAN{{FIELD=VALUE}}]=LEVEL; LEVEL is one of {})",
                LEVELS.join(", ")
            )
        })?;
        kept.push(d);
    }
    EnvFilter::builder()
        .parse(kept.join(","))
        .map_err(|e| format!("IDEM_LOG: {spec:?}: {e}"))
}

/// Checks one non-empty directive; the reason it is refused.
fn check(d: &str) -> Result<(), &'static str> {
    if let Some(open) = d.find('[') {
        let target = &d[..open];
        if !target.is_empty() && !is_target(target) {
            return Err("names no valid target before '['");
        }
        let rest = &d[open + 1..];
        let close = rest.find(']').ok_or("has no ']' closing its span filter")?;
        if rest[..close].contains('[') {
            return Err("nests '['");
        }
        let level = rest[close + 1..]
            .strip_prefix('=')
            .ok_or("has no =LEVEL after its span filter")?;
        if !is_level(level) {
            return Err("has no valid level after its span filter");
        }
        return Directive::from_str(d)
            .map(|_| ())
            .map_err(|_| "is not a valid span filter");
    }
    match d.split_once('=') {
        None if is_level(d) => Ok(()),
        None => Err("is not a level (a target needs =LEVEL)"),
        Some((target, _)) if !is_target(target) => Err("names no valid target before '='"),
        Some((_, level)) if is_level(level) => Ok(()),
        Some(_) => Err("has no valid level after '='"),
    }
}

fn is_level(s: &str) -> bool {
    LEVELS.iter().any(|l| l.eq_ignore_ascii_case(s))
}

/// A module path: `::`-separated identifiers.
fn is_target(s: &str) -> bool {
    s.split("::").all(|part| {
        let mut chars = part.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn levels_targets_and_span_filters_are_accepted() {
        for ok in [
            "info",
            "WARN",
            "off",
            "idem_org=debug",
            "warn,idem_replica::ship=trace",
            "idem_org[ship]=debug",
            "[request{org=acme}]=trace",
            "info,",
            " debug , idem_org=warn ",
        ] {
            assert!(parse(ok).is_ok(), "{ok:?}: {:?}", parse(ok).err());
        }
    }

    #[test]
    fn anything_else_is_refused_naming_the_directive() {
        for (bad, named) in [
            ("debgu", "\"debgu\""),
            ("[[", "\"[[\""),
            ("idem=notalevel", "\"idem=notalevel\""),
            ("info,idem_org=verbose", "\"idem_org=verbose\""),
            ("3", "\"3\""),
            ("=info", "\"=info\""),
            ("a b=info", "\"a b=info\""),
            ("idem_org[ship]", "\"idem_org[ship]\""),
            ("idem_org[ship=debug", "\"idem_org[ship=debug\""),
            ("idem::=info", "\"idem::=info\""),
        ] {
            let err = parse(bad).err().unwrap_or_default();
            assert!(err.starts_with("IDEM_LOG: "), "{bad:?}: {err}");
            assert!(err.contains(named), "{bad:?}: {err}");
            assert!(!err.contains('\n'), "{bad:?}: one line: {err}");
        }
    }
}
