//! The test Redis Cluster itself: it forms with the topology asked for, a
//! killed master's replica takes over, and a slot moves between masters.

use baton_testkit::RedisCluster;

fn slot_of(conn: &mut redis::Connection, key: &str) -> u16 {
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(conn)
        .unwrap()
}

#[test]
fn three_masters_with_a_replica_each_fail_over_and_move_slots() {
    let mut cluster = RedisCluster::start(3, 1);
    let shards = cluster.shards();
    assert_eq!(shards.len(), 3, "{shards:?}");
    assert!(
        shards.iter().all(|s| s.replica_ports.len() == 1),
        "{shards:?}"
    );
    assert!(cluster.url().starts_with("redis+cluster://127.0.0.1:"));

    let first = &cluster.nodes[0];
    let mut conn = redis::Client::open(format!("redis://127.0.0.1:{}/", first.port))
        .unwrap()
        .get_connection()
        .unwrap();
    let slot = slot_of(&mut conn, "{baton}:probe");
    let owner = cluster.master_of(slot);
    let target = shards
        .iter()
        .find(|s| s.master_port != owner.master_port)
        .unwrap()
        .master_port;
    cluster.move_slot(slot, target);
    assert_eq!(cluster.master_of(slot).master_port, target);

    cluster.kill(target);
    let new = cluster.wait_failover(slot, target);
    assert_ne!(new.master_port, target);
    cluster.start_again(target);
    cluster.wait_healthy(6);
}

#[test]
fn one_and_two_master_clusters_are_assembled_by_hand() {
    for masters in [1, 2] {
        let cluster = RedisCluster::start(masters, 0);
        let shards = cluster.shards();
        assert_eq!(shards.len(), masters, "{shards:?}");
        let served: u32 = shards
            .iter()
            .flat_map(|s| s.slots.iter())
            .map(|&(a, b)| u32::from(b - a) + 1)
            .sum();
        assert_eq!(served, 16384);
    }
}
