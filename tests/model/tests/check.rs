//! Exhaustive checks of the lease model.

use caracal_model::{Config, check};

#[test]
fn explore() {
    let mut config = Config::bounded();
    let get = |k: &str, d: u8| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    config.uses = get("U", config.uses);
    config.freezes = get("F", config.freezes);
    config.partitions = get("P", config.partitions);
    config.losses = get("L", config.losses);
    if get("C", 3) == 2 { config.callers = vec![0, 1]; }
    match get("K", 0) { 1 => config.loss_kinds = vec![caracal_model::LossKind::Restart], 2 => config.loss_kinds = vec![caracal_model::LossKind::Failover], 3 => config.loss_kinds = vec![caracal_model::LossKind::Flush], _ => {} }
    config.ttl = get("T", config.ttl);
    if get("NW", 0) == 1 { config.writes = false; }
    if get("NB", 0) == 1 { config.broadcast = false; }
    if get("NK", 0) == 1 { config.carry_known = false; }
    if get("ND", 0) == 1 { config.denied_renewal_is_loss = false; }
    config.renew_every = get("R", config.renew_every);
    config.grace = get("G", config.grace);
    let model = caracal_model::LeaseModel { config: config.clone() };
    let outcome = check(config, 2);
    println!("{} states ({} unique), depth {}, {:?}", outcome.states, outcome.unique_states, outcome.max_depth, outcome.elapsed);
    for (name, _) in &outcome.discoveries {
        println!("found: {name}");
        let show = std::env::var("SHOW").unwrap_or_default();
        if (!name.starts_with("a ") && !name.starts_with("two") && !name.starts_with("the downstream refuses")) || (!show.is_empty() && name.contains(&show)) {
            println!("{}", caracal_model::narrate(&model, &outcome.discoveries[name]));
        }
    }
}
