//! `idem effects`: an org's external effects by state, from its newest snapshot (the
//! acknowledged state), and one effect's history with `--key`.
//!
//! This command is a reader with no writer's observation behind it: it shows a RESERVED row
//! whose lease has passed by this host's clock as AMBIGUOUS (`"lapsed": true`, the stored
//! state beside it). That is a comparison with the holder's stamp, another host's clock, so
//! it only informs: no decision rests on it. `idem resolve` acts only after a writer of its
//! own has judged the lease by its own observation (`docs/effects.md`, "Whose clock").

use clap::Args;
use idem_org::idem::effect::{self, Effect, Transition};
use serde_json::{Value, json};

use super::{history, open_read_only, org_id, print_json, rfc3339};

/// `idem effects`.
#[derive(Debug, Args)]
pub struct EffectsArgs {
    /// The org id.
    org: String,
    /// Store URL.
    #[arg(long)]
    store: String,
    /// Only effects in this state: reserved, committed, failed, ambiguous (a reservation
    /// whose lease passed by this host's clock is listed as ambiguous).
    #[arg(long, value_parser = parse_state, conflicts_with = "key")]
    state: Option<effect::State>,
    /// Only this effect, with its history (who, when, what for every transition).
    #[arg(long)]
    key: Option<String>,
    /// Print as JSON.
    #[arg(long)]
    json: bool,
}

fn parse_state(s: &str) -> Result<effect::State, String> {
    effect::State::parse(s)
        .ok_or_else(|| format!("unknown state {s:?}: reserved, committed, failed or ambiguous"))
}

/// An effect row as JSON: `state` as judged (a lapsed reservation reads `ambiguous`),
/// `stored_state` as stored, `lapsed` when they differ for that reason.
pub(crate) fn effect_json(stored: &Effect, judged: &Effect) -> Value {
    json!({
        "key": judged.key,
        "state": judged.state.as_str(),
        "stored_state": stored.state.as_str(),
        "lapsed": judged.state != stored.state,
        "attempt": judged.attempt_hex(),
        "attempts": judged.attempts,
        "holder": judged.holder,
        "lease_until": rfc3339(judged.lease_until_ms),
        "created": rfc3339(judged.created_ms),
        "updated": rfc3339(judged.updated_ms),
        "error": judged.error,
        "result": judged.result.as_ref().map(|r| String::from_utf8_lossy(r).into_owned()),
        "result_kept": !judged.result_not_kept(),
        "resolved_by": judged.resolved_by,
    })
}

fn transition_json(t: &Transition) -> Value {
    json!({
        "seq": t.seq,
        "at": rfc3339(t.at_ms),
        "state": t.state.as_str(),
        "attempt": t.attempt.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        "actor": t.actor,
        "detail": t.detail,
    })
}

/// Lists the effects of the org's newest published snapshot (the acknowledged state).
///
/// # Errors
/// Bad store URL or org id, unknown org or key, store or snapshot failures.
pub async fn effects(a: EffectsArgs) -> Result<std::process::ExitCode, String> {
    let replica = open_read_only(&a.store)?;
    let org = org_id(&a.org)?;
    history(&replica, &a.store, &org).await?;
    let restored = crate::store::restored::restore(&replica, &org, None).await?;
    let conn = restored.as_ref().map(|r| r.open()).transpose()?;
    let read =
        |e: idem_org::idem::Error| format!("reading the newest snapshot: {}", crate::chain(&e));
    // This host's clock against each row's own stamp: see the module comment.
    let judge = effect::Options::new();
    if let Some(key) = &a.key {
        let stored = match &conn {
            Some(c) => effect::get(c, key).map_err(read)?,
            None => None,
        }
        .ok_or_else(|| format!("org {org}: no effect {key:?} in the store"))?;
        let trail = match &conn {
            Some(c) => effect::history(c, key).map_err(read)?,
            None => Vec::new(),
        };
        let judged = stored.as_judged(&judge);
        if a.json {
            let mut v = effect_json(&stored, &judged);
            v["history"] = trail.iter().map(transition_json).collect();
            print_json(&json!({"org": org.as_str(), "effect": v}));
        } else {
            print_row(&judged);
            for t in &trail {
                outln!(
                    "  {}\t{}\t{}\t{}",
                    rfc3339(t.at_ms),
                    t.state,
                    t.actor.as_deref().unwrap_or("-"),
                    t.detail.as_deref().unwrap_or("")
                );
            }
        }
        return Ok(std::process::ExitCode::SUCCESS);
    }
    let rows = match (&conn, a.state) {
        (None, _) => Vec::new(),
        // Either may be a lapsed reservation: read the open rows (an index), judge them.
        (Some(c), Some(effect::State::Reserved | effect::State::Ambiguous)) => {
            let mut open = effect::list(c, Some(effect::State::Reserved)).map_err(read)?;
            open.extend(effect::list(c, Some(effect::State::Ambiguous)).map_err(read)?);
            open.sort_by(|x, y| x.key.cmp(&y.key));
            open
        }
        (Some(c), state) => effect::list(c, state).map_err(read)?,
    };
    let now = judge.now();
    let shown: Vec<(Effect, Effect)> = rows
        .into_iter()
        .map(|stored| {
            let judged = stored.judged_at(&judge, now);
            (stored, judged)
        })
        .filter(|(_, judged)| a.state.is_none_or(|s| judged.state == s))
        .collect();
    if a.json {
        let list: Vec<Value> = shown.iter().map(|(s, j)| effect_json(s, j)).collect();
        print_json(&json!({"org": org.as_str(), "effects": list}));
    } else {
        for (_, judged) in &shown {
            print_row(judged);
        }
        let which = a.state.map_or(String::new(), |s| format!("{s} "));
        outln!("{} {which}effects in org {org}", shown.len());
    }
    Ok(std::process::ExitCode::SUCCESS)
}

fn print_row(e: &Effect) {
    outln!(
        "{}\t{}\tattempt {}\tupdated {}\t{}",
        e.key,
        e.state,
        e.attempt_hex(),
        rfc3339(e.updated_ms),
        e.error.as_deref().unwrap_or("")
    );
}
