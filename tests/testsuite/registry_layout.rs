//! Where the identity registry lives in Redis: 256 small hashes rather than one large one, so
//! Redis never grows a table of tens of thousands of fields inside a report (one hash of
//! 80 000 fields took over 1 ms to grow: issue 27, item 3), two fields per identity
//! (`lua/registry_prelude.lua`); and the layouts earlier versions wrote (eight fields per
//! identity in 256 hashes, and before that in a single hash), still listed and emptied as
//! they expire during a rolling upgrade.

use caracal::admin::{BreakerCommand, BreakerId};
use caracal::{bulkhead, retry, retry_budget};
use caracal_tests::stats::CommandLog;
use caracal_tests::{RedisCluster, RedisServer};
use sha2::{Digest, Sha256};

use crate::common::{self, TestError, eventually};

/// The fields a report writes per identity (`lua/registry_prelude.lua`).
const FIELDS: usize = 2;
/// The registry's hashes, named by the first two hex digits of their identities' tags.
const HASHES: usize = 256;

/// A tag as identities' are: 64 hex digits of a SHA-256.
fn tag(n: usize) -> String {
    Sha256::digest(n.to_string().as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// How many fields each of `namespace`'s registry hashes holds, whatever their names: those
/// of this version's layout (`entries:*`) or of the eight-field one (`identities:*`).
fn hash_sizes(conn: &mut redis::Connection, namespace: &str, layout: &str) -> Vec<usize> {
    let pattern = format!("{}{layout}", common::namespace_key_base(namespace));
    let hashes: Vec<String> = redis::cmd("SCAN")
        .cursor_arg(0)
        .arg("MATCH")
        .arg(pattern)
        .arg("TYPE")
        .arg("hash")
        .clone()
        .iter(conn)
        .expect("SCAN")
        .collect::<Result<_, _>>()
        .expect("SCAN");
    assert!(!hashes.is_empty(), "no registry hash");
    let mut pipe = redis::pipe();
    for hash in &hashes {
        pipe.cmd("HLEN").arg(hash);
    }
    pipe.query(conn).expect("HLEN")
}

/// Reports `reported` identities of `kind` (`s0`, `s1`… scopes of one name) to `namespace`'s
/// registry bounded to `kept`, 8 a call, as this version's report script does (later ones
/// expire later, so the bound forgets the earliest first).
fn report_pages(
    conn: &mut redis::Connection,
    namespace: &str,
    reported: usize,
    kept: usize,
    kind: &str,
) {
    let base = common::namespace_key_base(namespace);
    let report = redis::Script::new(&caracal_tests::stats::script_source("registry_report"));
    for page in 0..reported / 8 {
        let mut call = report.prepare_invoke();
        call.key(format!("{base}entries:"))
            .key(format!("{base}entries:expiry"))
            .key(format!("{base}processes"))
            .key(format!("{base}processes:expiry"))
            .key(format!("{base}registry"))
            .key(format!("{base}registry:expiry"))
            .key(format!("{base}identities:"))
            .key(format!("{base}identities:expiry"))
            .arg(kept)
            .arg(15_000)
            .arg("p")
            .arg("{}")
            .arg(30_000)
            .arg(100);
        for n in page * 8..page * 8 + 8 {
            call.arg(tag(n))
                .arg(format!(r#"["{kind}","b","b","s{n}"]"#))
                .arg("limit=5")
                .arg("attribute")
                .arg("p/site")
                .arg(60_000 + n)
                .arg(0)
                .arg("{}");
        }
        let drifts: Vec<i64> = call.invoke(conn).expect("a report");
        assert_eq!(drifts.len(), 8);
    }
}

/// Scoped retry budgets far past the registry's bound (2 048, 1 000 kept): their entries in
/// the eight-field layout (written so earlier processes find them) are kept within the same
/// bound, the latest, and nothing of a forgotten one stays there. Red without the report's
/// trim of that layout (all 2 048 stay within their ttl).
#[test]
fn budgets_earlier_entries_are_kept_within_the_bound() {
    /// The fields of a budget's eight-field entry this version writes (all but `:x`, `:u`).
    const EARLIER_FIELDS: usize = 6;
    const REPORTED: usize = 2_048;
    const KEPT: usize = 1_000;
    let server = RedisServer::start();
    let mut conn = server.connection();
    let namespace = common::unique("layout-budgets");
    let base = common::namespace_key_base(&namespace);
    report_pages(&mut conn, &namespace, REPORTED, KEPT, "retry_budget");
    let kept: Vec<String> = redis::cmd("ZRANGE")
        .arg(format!("{base}identities:expiry"))
        .arg(0)
        .arg(-1)
        .query(&mut conn)
        .expect("ZRANGE");
    let latest: Vec<String> = (REPORTED - KEPT..REPORTED).map(tag).collect();
    let (mut kept, mut latest) = (kept, latest);
    kept.sort_unstable();
    latest.sort_unstable();
    assert_eq!(kept, latest, "the eight-field layout past its bound");
    let sizes = hash_sizes(&mut conn, &namespace, "identities:*");
    assert_eq!(
        sizes.iter().sum::<usize>(),
        KEPT * EARLIER_FIELDS,
        "fields of forgotten budgets left behind"
    );
}

/// Reports far past the registry's bound (2 048 identities, 1 000 kept) leave every identity
/// kept in the hash its tag names and nothing of a forgotten one: the fields add up to 2 per
/// identity kept, and no hash holds more than three times its share. Red with one hash for
/// all (`tag:sub(1, 0)` in the report) or with forgetting from a hash the tag does not name.
#[test]
fn reports_spread_the_registry_over_small_hashes_and_forget_from_them() {
    const REPORTED: usize = 2_048;
    const KEPT: usize = 1_000;
    let server = RedisServer::start();
    let mut conn = server.connection();
    let namespace = common::unique("layout");
    report_pages(&mut conn, &namespace, REPORTED, KEPT, "bulkhead");
    let kept: usize = redis::cmd("ZCARD")
        .arg(common::registry_expiry(&namespace))
        .query(&mut conn)
        .expect("ZCARD");
    assert_eq!(kept, KEPT);
    let sizes = hash_sizes(&mut conn, &namespace, "entries:*");
    assert_eq!(
        sizes.iter().sum::<usize>(),
        KEPT * FIELDS,
        "fields of forgotten identities left behind: {sizes:?}"
    );
    let share = KEPT * FIELDS / HASHES;
    assert!(
        sizes.iter().all(|&size| size <= 3 * share),
        "a hash past three times its share of {share}: {sizes:?}"
    );
    // What the bound kept is the latest, each in the hash its tag names.
    for n in REPORTED - KEPT..REPORTED {
        let tag = tag(n);
        let there: (bool, bool) = redis::pipe()
            .cmd("HEXISTS")
            .arg(common::registry_hash(&namespace, &tag))
            .arg(&tag)
            .cmd("HEXISTS")
            .arg(common::registry_hash(&namespace, &tag))
            .arg(format!("{tag}:u"))
            .query(&mut conn)
            .expect("HEXISTS");
        assert_eq!(there, (true, true), "identity {n} not in its hash");
    }
}

#[bulkhead(name = "layout-used", limit = 5)]
async fn used() -> Result<(), TestError> {
    Ok(())
}

/// A rolling upgrade: what earlier versions wrote in their single hash is still listed (a
/// bulkhead an operator held there, which no process reports), and what expired there is
/// forgotten by this version's reports until the old keys are gone. Red without the read of
/// the earlier hash (the held identity missing from `status`) or without its forgetting (the
/// expired one's fields stay).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_versions_registry_is_listed_and_emptied_as_it_expires() {
    let server = RedisServer::start();
    let coordinator = common::redis(&server.url()).await;
    let mut conn = server.connection();
    let namespace = coordinator.namespace().to_owned();
    let base = common::namespace_key_base(&namespace);
    let (earlier, earlier_expiry) = (format!("{base}registry"), format!("{base}registry:expiry"));
    let now = common::server_time_ms(&mut conn);
    let (held, expired) = (tag(1), tag(2));
    let () = redis::pipe()
        .cmd("HSET")
        .arg(&earlier)
        .arg(format!("{held}:d"))
        .arg(r#"["bulkhead","layout-held","layout-held","global"]"#)
        .ignore()
        .cmd("HSET")
        .arg(&earlier)
        .arg(format!("{expired}:d"))
        .arg(r#"["bulkhead","layout-gone","layout-gone","global"]"#)
        .arg(format!("{expired}:v"))
        .arg("limit=5")
        .ignore()
        .cmd("ZADD")
        .arg(&earlier_expiry)
        .arg(now + 3_600_000)
        .arg(&held)
        .arg(now - 1)
        .arg(&expired)
        .ignore()
        .query(&mut conn)
        .expect("an earlier version's registry");
    let status = coordinator.admin().status().await.expect("status");
    let names: Vec<(&str, bool)> = status
        .iter()
        .map(|row| (row.name.as_str(), row.in_use))
        .collect();
    assert_eq!(names, [("layout-held", false)]);

    // A process of this version reports what it uses: its reports forget the expired.
    coordinator.scoped(used()).await.expect("served");
    let used = common::key_base(&namespace, "bulkhead", "layout-used", "global")
        .replace("caracal:v1:{", "")
        .replace("}:", "");
    let exists = |conn: &mut redis::Connection, hash: &str, field: String| -> bool {
        redis::cmd("HEXISTS")
            .arg(hash)
            .arg(field)
            .query(conn)
            .expect("HEXISTS")
    };
    eventually(
        "the use reported and the expired identity forgotten",
        || {
            exists(
                &mut conn,
                &common::registry_hash(&namespace, &used),
                used.clone(),
            ) && !exists(&mut conn, &earlier, format!("{expired}:d"))
        },
    )
    .await;
    let mut check = server.connection();
    let kept: Vec<String> = redis::cmd("ZRANGE")
        .arg(&earlier_expiry)
        .arg(0)
        .arg(-1)
        .query(&mut check)
        .expect("ZRANGE");
    assert_eq!(kept, [held]);
    let status = coordinator.admin().status().await.expect("status");
    let mut names: Vec<&str> = status.iter().map(|row| row.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["layout-held", "layout-used"]);
}

#[bulkhead(name = "layout-both", limit = 5)]
async fn both() -> Result<(), TestError> {
    Ok(())
}

#[bulkhead(name = "layout-new", limit = 5)]
async fn new_only() -> Result<(), TestError> {
    Ok(())
}

/// A rolling upgrade: a process of the version before (eight fields per identity, its report
/// as it shipped) and one of this version report at once. The reader lists each identity once,
/// in use, whichever wrote it, and one both use with both processes' uses (the earlier
/// process's rates added to this one's). Red without the read of the eight-field layout (the
/// identity only the earlier process uses missing) or without adding the uses of an identity
/// both layouts hold (its rates this process's alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_writer_and_this_one_are_read_together() {
    const EARLIER_RATE: f64 = 1_000.0;
    let server = RedisServer::start();
    let coordinator = common::redis(&server.url()).await;
    let mut conn = server.connection();
    let namespace = coordinator.namespace().to_owned();
    let base = common::namespace_key_base(&namespace);
    let tag_of = |name: &str| {
        common::key_base(&namespace, "bulkhead", name, "global")
            .replace("caracal:v1:{", "")
            .replace("}:", "")
    };
    let earlier = redis::Script::new(include_str!("fixtures/registry_report_fields.lua"));
    let mut call = earlier.prepare_invoke();
    call.key(format!("{base}identities:"))
        .key(format!("{base}identities:expiry"))
        .key(format!("{base}processes"))
        .key(format!("{base}processes:expiry"))
        .key(format!("{base}registry"))
        .key(format!("{base}registry:expiry"))
        .arg(10_000)
        .arg(15_000)
        .arg("earlier")
        .arg(r#"{"host":"h","pid":1,"version":"0.0.9","identities":2}"#)
        .arg(30_000)
        .arg(100);
    for name in ["layout-old", "layout-both"] {
        call.arg(tag_of(name))
            .arg(format!(r#"["bulkhead","{name}","{name}","global"]"#))
            .arg("limit=5 lease=30s max_wait=none")
            .arg("attribute attribute attribute")
            .arg("earlier/site")
            .arg(600_000)
            .arg(0)
            .arg(format!(r#"{{"admitted":{EARLIER_RATE}}}"#));
    }
    let drifts: Vec<i64> = call
        .invoke(&mut conn)
        .expect("the earlier version's report");
    assert_eq!(drifts, [0, 0]);

    coordinator.scoped(both()).await.expect("served");
    coordinator.scoped(new_only()).await.expect("served");
    let mut check = server.connection();
    eventually("this process's uses reported", || {
        ["layout-both", "layout-new"].iter().all(|name| {
            let tag = tag_of(name);
            redis::cmd("HEXISTS")
                .arg(common::registry_hash(&namespace, &tag))
                .arg(&tag)
                .query(&mut check)
                .unwrap_or(false)
        })
    })
    .await;
    let status = coordinator.admin().status().await.expect("status");
    let mut rows: Vec<(&str, bool)> = status
        .iter()
        .map(|row| (row.name.as_str(), row.in_use))
        .collect();
    rows.sort_unstable();
    assert_eq!(
        rows,
        [
            ("layout-both", true),
            ("layout-new", true),
            ("layout-old", true)
        ]
    );
    let both = status
        .iter()
        .find(|row| row.name == "layout-both")
        .expect("listed");
    assert!(
        both.rates.admitted >= EARLIER_RATE,
        "the earlier process's rate not added: {:?}",
        both.rates
    );
}

/// What the eight-field versions' read (`registry_read.lua` as it shipped, a fixture) lists
/// of `namespace`'s registry: per identity, its description and its values.
fn earlier_read(conn: &mut redis::Connection, namespace: &str) -> Vec<(String, String)> {
    let base = common::namespace_key_base(namespace);
    let read = redis::Script::new(include_str!("fixtures/registry_read_fields.lua"));
    let reply: Vec<redis::Value> = read
        .key(format!("{base}identities:"))
        .key(format!("{base}identities:expiry"))
        .arg(0)
        .arg(100)
        .arg(2)
        .invoke(conn)
        .expect("the earlier version's read");
    let text =
        |value: &redis::Value| -> String { redis::from_redis_value_ref(value).expect("text") };
    reply[2..]
        .chunks_exact(6)
        .map(|entry| (text(&entry[1]), text(&entry[2])))
        .collect()
}

#[retry_budget(
    name = "layout-budget",
    percent = 10,
    min_per_second = 1,
    window = "60s"
)]
#[retry(max_attempts = 2)]
async fn budgeted() -> Result<(), TestError> {
    Ok(())
}

#[bulkhead(name = "layout-unbudgeted", limit = 5)]
async fn unbudgeted() -> Result<(), TestError> {
    Ok(())
}

/// A rolling upgrade: a process of the eight-field versions finds a retry budget it does not
/// configure (a hedge's, defined in an upgraded service) through its own layout only. This
/// version's report writes a budget there too (and only a budget): the earlier read, as it
/// shipped, lists it with its values. Red without that write (nothing listed: the earlier
/// process's hedge fails with `InvalidConfig` once the old entries expire).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_process_finds_a_budget_this_version_reports() {
    let server = RedisServer::start();
    let coordinator = common::redis(&server.url()).await;
    let namespace = coordinator.namespace().to_owned();
    coordinator.scoped(budgeted()).await.expect("served");
    coordinator.scoped(unbudgeted()).await.expect("served");
    let tag_of = |kind: &str, name: &str| {
        common::key_base(&namespace, kind, name, "global")
            .replace("caracal:v1:{", "")
            .replace("}:", "")
    };
    let mut conn = server.connection();
    eventually("both uses reported", || {
        [
            tag_of("retrybudget", "layout-budget"),
            tag_of("bulkhead", "layout-unbudgeted"),
        ]
        .iter()
        .all(|tag| {
            redis::cmd("HEXISTS")
                .arg(common::registry_hash(&namespace, tag))
                .arg(tag)
                .query(&mut conn)
                .unwrap_or(false)
        })
    })
    .await;
    let listed = earlier_read(&mut conn, &namespace);
    assert_eq!(listed.len(), 1, "the budget alone: {listed:?}");
    let (description, values) = &listed[0];
    assert!(
        description.starts_with(r#"["retry_budget","layout-budget""#),
        "{description}"
    );
    assert!(values.contains("percent=10"), "{values}");
}

/// A rolling upgrade: this version reports a retry budget (`percent=10`), a process of the
/// eight-field versions (their report as it shipped, a fixture) reports it with other values
/// under the same fleet overrides, noticing drift in its layout's `:x`, and this version
/// reports it again. The drift stays recorded there and listed. Red when this version's
/// write of the budget's earlier entry sets `:x` from its own layout (none there: the drift
/// erased every report).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budgets_drift_an_earlier_process_noticed_stays() {
    let server = RedisServer::start();
    let coordinator = common::redis(&server.url()).await;
    let namespace = coordinator.namespace().to_owned();
    let base = common::namespace_key_base(&namespace);
    let tag = common::key_base(&namespace, "retrybudget", "layout-budget", "global")
        .replace("caracal:v1:{", "")
        .replace("}:", "");
    let earlier_hash = format!("{base}identities:{}", &tag[..2]);
    let mut conn = server.connection();
    // Its earlier entry's reporter, description and fleet overrides' version, once written.
    let reported = |conn: &mut redis::Connection| -> Option<(String, String, String)> {
        let (r, d, f): (Option<String>, Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(&earlier_hash)
            .arg(format!("{tag}:r"))
            .arg(format!("{tag}:d"))
            .arg(format!("{tag}:f"))
            .query(conn)
            .expect("HMGET");
        Some((r?, d?, f?))
    };
    coordinator.scoped(budgeted()).await.expect("served");
    eventually("the budget reported", || reported(&mut conn).is_some()).await;
    let (_, description, fleet) = reported(&mut conn).expect("reported");

    let earlier = redis::Script::new(include_str!("fixtures/registry_report_fields.lua"));
    let drifts: Vec<i64> = earlier
        .key(format!("{base}identities:"))
        .key(format!("{base}identities:expiry"))
        .key(format!("{base}processes"))
        .key(format!("{base}processes:expiry"))
        .key(format!("{base}registry"))
        .key(format!("{base}registry:expiry"))
        .arg(10_000)
        .arg(15_000)
        .arg("earlier")
        .arg(r#"{"host":"h","pid":1,"version":"0.0.9","identities":1}"#)
        .arg(30_000)
        .arg(100)
        .arg(&tag)
        .arg(&description)
        .arg("percent=20 min_per_second=1 window=60s")
        .arg("attribute attribute attribute")
        .arg("earlier/site")
        .arg(600_000)
        .arg(&fleet)
        .arg("{}")
        .invoke(&mut conn)
        .expect("the earlier version's report");
    assert_eq!(drifts, [1], "the earlier process notices the drift");

    // This process's next report (every few seconds, of what it used since the last).
    let deadline = tokio::time::Instant::now() + common::PATIENCE * 2;
    loop {
        coordinator.scoped(budgeted()).await.expect("served");
        if reported(&mut conn).is_some_and(|(r, _, _)| r != "earlier/site") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no second report of the budget"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let until: Option<u64> = redis::cmd("HGET")
        .arg(&earlier_hash)
        .arg(format!("{tag}:x"))
        .query(&mut conn)
        .expect("HGET");
    let now = common::server_time_ms(&mut conn);
    assert!(
        until.is_some_and(|until| until > now),
        "the earlier process's drift erased: {until:?} at {now}"
    );
    let status = coordinator.admin().status().await.expect("status");
    let row = status
        .iter()
        .find(|row| row.name == "layout-budget")
        .expect("listed");
    assert!(row.drift, "drift not listed: {row:?}");
}

/// An earlier CLI's force without end: a century.
const UNTIL_RESET_MS: u64 = 100 * 365 * 24 * 60 * 60 * 1000;

/// A rolling upgrade: an earlier CLI forced a breaker without end (its hold, as it shipped,
/// a fixture: the eight-field layout's entry, listed for a century), and this version's CLI
/// resets it. The reset removes the earlier entries (of both earlier layouts), so `status`
/// lists no stale row of the force once this version's hold ends. Red without the removal
/// in `lua/registry_hold.lua` (each assertion on its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_removes_an_earlier_clis_hold() {
    let server = RedisServer::start();
    let coordinator = common::redis(&server.url()).await;
    let namespace = coordinator.namespace().to_owned();
    let base = common::namespace_key_base(&namespace);
    let tag = common::key_base(&namespace, "breaker", "layout-forced", "global")
        .replace("caracal:v1:{", "")
        .replace("}:", "");
    let description = r#"["circuit_breaker","layout-forced","layout-forced","global"]"#;
    let mut conn = server.connection();
    let hold = redis::Script::new(include_str!("fixtures/registry_hold_fields.lua"));
    let _: u64 = hold
        .key(format!("{base}identities:"))
        .key(format!("{base}identities:expiry"))
        .arg(&tag)
        .arg(description)
        .arg(UNTIL_RESET_MS)
        .arg(15_000)
        .invoke(&mut conn)
        .expect("the earlier CLI's hold");
    // And the single hash before it, as the earliest versions held it.
    let () = redis::pipe()
        .cmd("HSET")
        .arg(format!("{base}registry"))
        .arg(format!("{tag}:d"))
        .arg(description)
        .ignore()
        .cmd("ZADD")
        .arg(format!("{base}registry:expiry"))
        .arg(common::server_time_ms(&mut conn) + UNTIL_RESET_MS)
        .arg(&tag)
        .ignore()
        .query(&mut conn)
        .expect("the earliest layout's hold");
    assert_eq!(earlier_read(&mut conn, &namespace).len(), 1);

    coordinator
        .admin()
        .breaker(&BreakerId::new("layout-forced"), BreakerCommand::Reset)
        .await
        .expect("reset");
    let held: Vec<(Option<String>, Option<u64>)> = [
        (
            format!("{base}identities:{}", &tag[..2]),
            format!("{base}identities:expiry"),
        ),
        (format!("{base}registry"), format!("{base}registry:expiry")),
    ]
    .iter()
    .map(|(hash, expiry)| {
        redis::pipe()
            .cmd("HGET")
            .arg(hash)
            .arg(format!("{tag}:d"))
            .cmd("ZSCORE")
            .arg(expiry)
            .arg(&tag)
            .query(&mut conn)
            .expect("the earlier layouts")
    })
    .collect();
    assert_eq!(
        held,
        [(None, None), (None, None)],
        "an earlier hold left behind"
    );
    // Once this version's hold ends, nothing lists the identity (an earlier layout's century
    // entry left behind still would).
    let () = redis::cmd("ZADD")
        .arg(common::registry_expiry(&namespace))
        .arg(common::server_time_ms(&mut conn) - 1)
        .arg(&tag)
        .query(&mut conn)
        .expect("the hold ended");
    let status = coordinator.admin().status().await.expect("status");
    let rows: Vec<&str> = status.iter().map(|row| row.name.as_str()).collect();
    assert!(rows.is_empty(), "a stale row: {rows:?}");
}

/// A rolling upgrade: a process of the eight-field versions reports a breaker (their report
/// as it shipped, a fixture), an earlier CLI forces it without end, and this version's CLI
/// resets it. The earlier process's entry stays, its values and uses with it, listed in use:
/// only an earlier CLI's hold is removed; the force's century expiry is cut to the reset's.
/// Red when the hold removes the earlier entry whatever it is, or keeps its expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_keeps_an_earlier_processs_report() {
    let server = RedisServer::start();
    let coordinator = common::redis(&server.url()).await;
    let namespace = coordinator.namespace().to_owned();
    let base = common::namespace_key_base(&namespace);
    let tag = common::key_base(&namespace, "breaker", "layout-reported", "global")
        .replace("caracal:v1:{", "")
        .replace("}:", "");
    let mut conn = server.connection();
    let earlier = redis::Script::new(include_str!("fixtures/registry_report_fields.lua"));
    let drifts: Vec<i64> = earlier
        .key(format!("{base}identities:"))
        .key(format!("{base}identities:expiry"))
        .key(format!("{base}processes"))
        .key(format!("{base}processes:expiry"))
        .key(format!("{base}registry"))
        .key(format!("{base}registry:expiry"))
        .arg(10_000)
        .arg(15_000)
        .arg("earlier")
        .arg(r#"{"host":"h","pid":1,"version":"0.0.9","identities":1}"#)
        .arg(30_000)
        .arg(100)
        .arg(&tag)
        .arg(r#"["circuit_breaker","layout-reported","layout-reported","global"]"#)
        .arg("failure_ratio=0.5")
        .arg("attribute")
        .arg("earlier/site")
        .arg(600_000)
        .arg(0)
        .arg("{}")
        .invoke(&mut conn)
        .expect("the earlier version's report");
    assert_eq!(drifts, [0]);
    let hold = redis::Script::new(include_str!("fixtures/registry_hold_fields.lua"));
    let _: u64 = hold
        .key(format!("{base}identities:"))
        .key(format!("{base}identities:expiry"))
        .arg(&tag)
        .arg(r#"["circuit_breaker","layout-reported","layout-reported","global"]"#)
        .arg(UNTIL_RESET_MS)
        .arg(15_000)
        .invoke(&mut conn)
        .expect("the earlier CLI's hold");

    coordinator
        .admin()
        .breaker(&BreakerId::new("layout-reported"), BreakerCommand::Reset)
        .await
        .expect("reset");
    let kept: (Option<String>, Option<String>, Option<u64>) = redis::pipe()
        .cmd("HGET")
        .arg(format!("{base}identities:{}", &tag[..2]))
        .arg(format!("{tag}:v"))
        .cmd("HGET")
        .arg(format!("{base}identities:{}", &tag[..2]))
        .arg(format!("{tag}:u"))
        .cmd("ZSCORE")
        .arg(format!("{base}identities:expiry"))
        .arg(&tag)
        .query(&mut conn)
        .expect("the earlier layout");
    assert!(
        matches!(&kept, (Some(values), Some(_), Some(_)) if values == "failure_ratio=0.5"),
        "the earlier process's report removed: {kept:?}"
    );
    let now = common::server_time_ms(&mut conn);
    assert!(
        kept.2.is_some_and(|until| until < now + UNTIL_RESET_MS / 2),
        "the earlier CLI's force without end still listed: {kept:?} at {now}"
    );
    let status = coordinator.admin().status().await.expect("status");
    let row = status
        .iter()
        .find(|row| row.name == "layout-reported")
        .expect("listed");
    assert!(row.in_use, "the earlier process's use lost: {row:?}");
}

#[bulkhead(name = "layout-cluster", limit = 5, scope = scope)]
async fn on_cluster(scope: &str) -> Result<(), TestError> {
    Ok(())
}

/// On a cluster, the registry's scripts name the hashes they touch from their tags (the
/// namespace's hash tag keeps them in its slot): a report writes them and a read lists what
/// it wrote. Red if a script touched a key of another slot (the report fails, nothing listed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_lists_what_its_processes_report() {
    let cluster = RedisCluster::start(3);
    let namespace = common::unique("layout-cluster");
    let coordinator = common::cluster_in(cluster.seed_urls(), &namespace).await;
    let scopes: Vec<String> = (0..20).map(|n| format!("s{n}")).collect();
    for scope in &scopes {
        coordinator.scoped(on_cluster(scope)).await.expect("served");
    }
    let deadline = tokio::time::Instant::now() + common::PATIENCE;
    loop {
        let status = coordinator.admin().status().await.expect("status");
        if status.len() == scopes.len() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {} listed",
            status.len(),
            scopes.len()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Issue 27: `status` read each identity's state with a script of its own, a round trip each
/// (10 000 at the registry's bound, well past a second). Now each kind's identities are read
/// many to a script: 40 bulkheads take a few scripts, each reading many lease sets. Counted in
/// the server's log, never timed. Red with one identity per script (`STATUS_BATCH = 1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reads_many_identities_states_per_script() {
    const IDENTITIES: usize = 40;
    /// The most scripts the reads may take: 16 identities a script (`STATUS_BATCH`), each
    /// maybe refused once before the server knew it (`EVALSHA`, then `EVAL`).
    const MOST_SCRIPTS: usize = 2 * IDENTITIES.div_ceil(16);
    let server = RedisServer::start();
    let coordinator = common::redis(&server.url()).await;
    let namespace = coordinator.namespace().to_owned();
    let mut conn = server.connection();
    let until = common::server_time_ms(&mut conn) + 600_000;
    let mut pipe = redis::pipe();
    for n in 0..IDENTITIES {
        let scope = format!("s{n}");
        let tag = common::key_base(&namespace, "bulkhead", "batched", &scope)
            .replace("caracal:v1:{", "")
            .replace("}:", "");
        pipe.cmd("HSET")
            .arg(common::registry_hash(&namespace, &tag))
            .arg(&tag)
            .arg(common::registry_head(
                &format!(r#"["bulkhead","batched","batched","{scope}"]"#),
                (0, ""),
                "limit=5 lease=30s max_wait=none",
                0,
            ))
            .ignore();
        pipe.cmd("ZADD")
            .arg(common::registry_expiry(&namespace))
            .arg(until)
            .arg(&tag)
            .ignore();
    }
    let () = pipe.query(&mut conn).expect("fill the registry");
    CommandLog::start(&mut conn);
    let listed = coordinator.admin().status().await.expect("status");
    assert_eq!(listed.len(), IDENTITIES, "every identity listed once");
    let log = CommandLog::read(&mut conn);
    let on_leases = |args: &&[String]| args.iter().any(|arg| arg.ends_with(":leases"));
    let reads = log.calls_of("zcount").filter(on_leases).count();
    assert_eq!(reads, IDENTITIES, "each identity's lease set read once");
    let scripts = ["evalsha", "eval"]
        .iter()
        .map(|verb| log.calls_of(verb).filter(on_leases).count())
        .sum::<usize>();
    assert!(
        (1..=MOST_SCRIPTS).contains(&scripts),
        "{scripts} scripts read {IDENTITIES} identities' states"
    );
}
