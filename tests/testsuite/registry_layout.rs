//! Where the identity registry lives in Redis: 256 small hashes rather than one large one, so
//! Redis never grows a table of tens of thousands of fields inside a report (one hash of
//! 80 000 fields took over 1 ms to grow: issue 27, item 3); and the single hash earlier
//! versions wrote, still listed and emptied as it expires during a rolling upgrade.

use caracal::bulkhead;
use caracal_tests::{RedisCluster, RedisServer};
use sha2::{Digest, Sha256};

use crate::common::{self, TestError, eventually};

/// The fields a report writes per identity (`lua/registry_report.lua`).
const FIELDS: usize = 8;
/// The registry's hashes, named by the first two hex digits of their identities' tags.
const HASHES: usize = 256;

/// A tag as identities' are: 64 hex digits of a SHA-256.
fn tag(n: usize) -> String {
    Sha256::digest(n.to_string().as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// How many fields each of `namespace`'s registry hashes holds, whatever their names.
fn hash_sizes(conn: &mut redis::Connection, namespace: &str) -> Vec<usize> {
    let pattern = format!("{}identities:*", common::namespace_key_base(namespace));
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

/// Reports far past the registry's bound (2 048 identities, 1 000 kept) leave every identity
/// kept in the hash its tag names and nothing of a forgotten one: the fields add up to 8 per
/// identity kept, and no hash holds more than three times its share. Red with one hash for
/// all (`tag:sub(1, 0)` in the report) or with forgetting from a hash the tag does not name.
#[test]
fn reports_spread_the_registry_over_small_hashes_and_forget_from_them() {
    const REPORTED: usize = 2_048;
    const KEPT: usize = 1_000;
    let server = RedisServer::start();
    let mut conn = server.connection();
    let namespace = common::unique("layout");
    let base = common::namespace_key_base(&namespace);
    let report = redis::Script::new(&caracal_tests::stats::script_source("registry_report"));
    for page in 0..REPORTED / 8 {
        let mut call = report.prepare_invoke();
        call.key(format!("{base}identities:"))
            .key(format!("{base}identities:expiry"))
            .key(format!("{base}processes"))
            .key(format!("{base}processes:expiry"))
            .key(format!("{base}registry"))
            .key(format!("{base}registry:expiry"))
            .arg(KEPT)
            .arg(15_000)
            .arg("p")
            .arg("{}")
            .arg(30_000)
            .arg(100);
        for n in page * 8..page * 8 + 8 {
            call.arg(tag(n))
                .arg(format!(r#"["bulkhead","b","b","s{n}"]"#))
                .arg("limit=5")
                .arg("attribute")
                .arg("p/site")
                // Later identities expire later: the bound forgets the earliest first.
                .arg(60_000 + n)
                .arg(0)
                .arg("{}");
        }
        let drifts: Vec<i64> = call.invoke(&mut conn).expect("a report");
        assert_eq!(drifts.len(), 8);
    }
    let kept: usize = redis::cmd("ZCARD")
        .arg(format!("{base}identities:expiry"))
        .query(&mut conn)
        .expect("ZCARD");
    assert_eq!(kept, KEPT);
    let sizes = hash_sizes(&mut conn, &namespace);
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
        let there: bool = redis::cmd("HEXISTS")
            .arg(common::registry_hash(&namespace, &tag))
            .arg(format!("{tag}:u"))
            .query(&mut conn)
            .expect("HEXISTS");
        assert!(there, "identity {n} not in its hash");
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
                format!("{used}:d"),
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
