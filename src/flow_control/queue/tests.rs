use std::sync::Arc;
use std::time::{Duration, Instant};

use std::net::SocketAddr;

use super::*;

fn admission(priority: i32, flow: &str, cost: f64, deadline: Instant) -> Admission {
    Admission {
        priority,
        flow: Arc::from(flow),
        pool: Arc::from("m"),
        pod: None,
        bytes: 100,
        cost,
        deadline,
    }
}

fn later(t0: Instant, s: u64) -> Instant {
    t0 + Duration::from_secs(s)
}

/// Pops everything (every pool can take), returning the items.
fn drain<T: Copy>(q: &mut FlowQueue<T>, now: Instant) -> Vec<T> {
    std::iter::from_fn(|| q.pop(now, |_, _| true).map(|p| p.item)).collect()
}

#[test]
fn one_flow_is_fifo() {
    let t0 = Instant::now();
    let mut q = FlowQueue::new(60.0, t0);
    for i in 0..5 {
        q.push(admission(0, "a", 10.0, later(t0, 30)), i);
    }
    assert_eq!(q.len(), 5);
    assert_eq!(q.bytes(), 500);
    assert_eq!(drain(&mut q, t0), [0, 1, 2, 3, 4]);
    assert!(q.is_empty());
    assert_eq!(q.bytes(), 0);
}

#[test]
fn a_flood_does_not_starve_a_light_flow() {
    // Heavy queues 20 long requests, then light queues 2 short ones: light goes first (it has
    // had no service), then light again as soon as its service is under heavy's.
    let t0 = Instant::now();
    let mut q = FlowQueue::new(60.0, t0);
    for i in 0..20 {
        q.push(admission(0, "heavy", 1500.0, later(t0, 30)), ("heavy", i));
    }
    // Heavy is served once before light arrives.
    assert_eq!(q.pop(t0, |_, _| true).unwrap().item, ("heavy", 0));
    q.push(admission(0, "light", 50.0, later(t0, 30)), ("light", 0));
    q.push(admission(0, "light", 50.0, later(t0, 30)), ("light", 1));
    let order = drain(&mut q, t0);
    assert_eq!(order[0], ("light", 0));
    assert_eq!(order[1], ("light", 1));
    // Within each flow, arrival order.
    let heavy: Vec<i32> = order
        .iter()
        .filter(|(f, _)| *f == "heavy")
        .map(|(_, i)| *i)
        .collect();
    assert_eq!(heavy, (1..20).collect::<Vec<_>>());
}

#[test]
fn equal_flows_alternate_by_weighted_tokens() {
    let t0 = Instant::now();
    let mut q = FlowQueue::new(60.0, t0);
    for i in 0..3 {
        q.push(admission(0, "a", 100.0, later(t0, 30)), ('a', i));
        q.push(admission(0, "b", 100.0, later(t0, 30)), ('b', i));
    }
    let order: Vec<char> = drain(&mut q, t0).into_iter().map(|(f, _)| f).collect();
    assert_eq!(order, ['a', 'b', 'a', 'b', 'a', 'b']);
    // A flow that costs 3x as much per request gets a third of the dispatches.
    let mut q = FlowQueue::new(60.0, t0);
    for i in 0..8 {
        q.push(admission(0, "big", 300.0, later(t0, 30)), ('B', i));
        q.push(admission(0, "small", 100.0, later(t0, 30)), ('s', i));
    }
    let first: String = drain(&mut q, t0)
        .into_iter()
        .take(8)
        .map(|(f, _)| f)
        .collect();
    assert_eq!(first, "BsssBsss");
}

#[test]
fn service_decays_with_the_half_life() {
    let t0 = Instant::now();
    let mut q: FlowQueue<u8> = FlowQueue::new(10.0, t0);
    q.push(admission(0, "a", 0.0, later(t0, 100)), 0);
    q.charge(0, "a", 1000.0, t0);
    assert!((q.served(0, "a", t0) - 1000.0).abs() < 1e-6);
    assert!((q.served(0, "a", later(t0, 10)) - 500.0).abs() < 1e-6);
    assert!((q.served(0, "a", later(t0, 20)) - 250.0).abs() < 1e-6);
    // A flow served long ago ranks with one never served, behind one served just now.
    let mut q = FlowQueue::new(10.0, t0);
    q.push(admission(0, "old", 0.0, later(t0, 1000)), "old");
    q.charge(0, "old", 1000.0, t0);
    let t1 = later(t0, 200);
    q.push(admission(0, "new", 0.0, later(t0, 1000)), "new");
    q.charge(0, "new", 1.0, t1);
    assert_eq!(drain(&mut q, t1), ["old", "new"]);
}

#[test]
fn the_epoch_moves_without_changing_the_order() {
    let t0 = Instant::now();
    let mut q: FlowQueue<&str> = FlowQueue::new(1.0, t0);
    q.push(admission(0, "a", 0.0, later(t0, 10_000)), "a");
    q.push(admission(0, "b", 0.0, later(t0, 10_000)), "b");
    q.charge(0, "a", 10.0, t0);
    q.charge(0, "b", 1.0, t0);
    // 40 half-lives later a charge passes the rescale point: values stay right.
    let t1 = later(t0, 40);
    q.charge(0, "a", 1.0, t1);
    assert!(q.epoch == t1);
    assert!((q.served(0, "a", t1) - (1.0 + 10.0 * 2f64.powi(-40))).abs() < 1e-9);
    assert_eq!(drain(&mut q, t1), ["b", "a"]);
}

#[test]
fn higher_bands_dispatch_first() {
    let t0 = Instant::now();
    let mut q = FlowQueue::new(60.0, t0);
    q.push(admission(0, "a", 1.0, later(t0, 30)), "normal-0");
    q.push(admission(-1, "a", 1.0, later(t0, 30)), "sheddable");
    q.push(admission(10, "b", 1.0, later(t0, 30)), "critical");
    q.push(admission(0, "a", 1.0, later(t0, 30)), "normal-1");
    assert_eq!(q.depths(), [(10, 1), (0, 2), (-1, 1)]);
    assert_eq!(
        drain(&mut q, t0),
        ["critical", "normal-0", "normal-1", "sheddable"]
    );
    assert!(q.depths().is_empty());
}

#[test]
fn ttl_expiry_removes_at_the_deadline_only() {
    let t0 = Instant::now();
    let mut q = FlowQueue::new(60.0, t0);
    let a = q.push(admission(0, "a", 1.0, later(t0, 5)), "a");
    q.push(admission(0, "a", 1.0, later(t0, 10)), "b");
    q.push(admission(0, "c", 1.0, later(t0, 5)), "c");
    assert_eq!(q.next_deadline(), Some(later(t0, 5)));
    assert!(q.expire(later(t0, 4)).is_empty());
    let expired: Vec<(u64, &str)> = q
        .expire(later(t0, 5))
        .into_iter()
        .map(|(id, item, _)| (id, item))
        .collect();
    assert_eq!(expired, [(a, "a"), (a + 2, "c")]);
    assert_eq!(q.len(), 1);
    assert_eq!(q.bytes(), 100);
    assert_eq!(q.next_deadline(), Some(later(t0, 10)));
    assert_eq!(drain(&mut q, t0), ["b"]);
}

#[test]
fn a_cancelled_request_leaves_at_once_and_its_flow_keeps_its_order() {
    let t0 = Instant::now();
    let mut q = FlowQueue::new(60.0, t0);
    let ids: Vec<u64> = (0..4)
        .map(|i| q.push(admission(0, "a", 1.0, later(t0, 30)), i))
        .collect();
    q.push(admission(0, "b", 1.0, later(t0, 30)), 10);
    // The head and one in the middle go.
    assert_eq!(q.remove(ids[0]).map(|(i, _)| i), Some(0));
    assert_eq!(q.remove(ids[2]).map(|(i, _)| i), Some(2));
    assert_eq!(q.remove(ids[2]).map(|(i, _)| i), None, "gone once");
    assert_eq!(q.len(), 3);
    assert_eq!(q.depths(), [(0, 3)]);
    let order = drain(&mut q, t0);
    // b's head arrived after a's new head (1): a first, then they alternate.
    assert_eq!(order, [1, 10, 3]);
    // A flow whose every request was cancelled is out of the order.
    let mut q = FlowQueue::new(60.0, t0);
    let only = q.push(admission(0, "x", 1.0, later(t0, 30)), 0);
    q.remove(only);
    assert!(q.pop(t0, |_, _| true).is_none());
    assert!(q.band_order_is_consistent());
}

#[test]
fn a_flow_whose_pool_cannot_take_waits_while_others_go() {
    let t0 = Instant::now();
    let mut q = FlowQueue::new(60.0, t0);
    let mut a = admission(0, "a", 1.0, later(t0, 30));
    a.pool = Arc::from("busy-model");
    q.push(a, "a0");
    q.push(admission(0, "b", 1.0, later(t0, 30)), "b0");
    q.push(admission(0, "b", 1.0, later(t0, 30)), "b1");
    let mut asked = Vec::new();
    let p = q.pop(t0, |pool, _| {
        asked.push(pool.to_string());
        pool != "busy-model"
    });
    assert_eq!(p.unwrap().item, "b0");
    assert_eq!(asked, ["busy-model", "m"], "each pool asked once");
    assert_eq!(
        q.pop(t0, |pool, _| pool != "busy-model").unwrap().item,
        "b1"
    );
    assert!(q.pop(t0, |pool, _| pool != "busy-model").is_none());
    assert_eq!(q.pop(t0, |_, _| true).unwrap().item, "a0");
}

#[test]
fn within_a_flow_a_request_for_a_pod_that_can_take_goes_past_one_that_cannot() {
    // One flow: requests held for pod x (full), then for pod y (free), then for x again. y's
    // goes first; x's go in their order once x can take; each pod asked once per pop.
    let t0 = Instant::now();
    let (x, y): (SocketAddr, SocketAddr) = (
        "10.0.0.1:80".parse().unwrap(),
        "10.0.0.2:80".parse().unwrap(),
    );
    let mut q = FlowQueue::new(60.0, t0);
    for (item, pod) in [("x0", x), ("y0", y), ("x1", x)] {
        let mut a = admission(0, "default", 1.0, later(t0, 30));
        a.pod = Some(pod);
        q.push(a, item);
    }
    q.push(admission(0, "default", 1.0, later(t0, 30)), "any");
    assert_eq!((q.pool_len("m", Some(x)), q.pool_len("m", Some(y))), (2, 1));
    assert_eq!(q.pool_len("m", None), 1);
    let mut asked = Vec::new();
    let p = q.pop(t0, |_, pod| {
        asked.push(pod);
        pod == Some(y)
    });
    assert_eq!(p.unwrap().item, "y0");
    assert_eq!(asked, [Some(x), Some(y)]);
    assert_eq!(q.pool_len("m", Some(y)), 0);
    let mut asked = 0;
    assert!(
        q.pop(t0, |_, _| {
            asked += 1;
            false
        })
        .is_none()
    );
    assert_eq!(asked, 2, "stops once every queued pool and pod said no");
    assert_eq!(q.pop(t0, |_, pod| pod.is_none()).unwrap().item, "any");
    assert_eq!(drain(&mut q, t0), ["x0", "x1"]);
    assert_eq!(q.pool_len("m", Some(x)), 0);
}

#[test]
fn displacement_takes_only_negative_priorities_below_the_newcomer() {
    let t0 = Instant::now();
    let mut q = FlowQueue::new(60.0, t0);
    q.push(admission(0, "a", 1.0, later(t0, 30)), "normal");
    assert!(q.displace(10).is_none(), "priority 0 is never displaced");
    q.push(admission(-1, "light", 1.0, later(t0, 30)), "light-old");
    q.push(admission(-1, "heavy", 1.0, later(t0, 30)), "heavy-old");
    q.push(admission(-1, "heavy", 1.0, later(t0, 30)), "heavy-new");
    q.charge(-1, "heavy", 1000.0, t0);
    q.push(admission(-5, "x", 1.0, later(t0, 30)), "lowest");
    assert!(q.displace(-5).is_none(), "not below the newcomer");
    // The lowest band goes first, then the heaviest flow's newest request.
    assert_eq!(q.displace(0).map(|(_, i, _)| i), Some("lowest"));
    assert_eq!(q.displace(0).map(|(_, i, _)| i), Some("heavy-new"));
    assert_eq!(q.displace(-1), None);
    assert_eq!(q.len(), 3);
    assert_eq!(drain(&mut q, t0), ["normal", "light-old", "heavy-old"]);
}

#[test]
fn prune_forgets_idle_flows_whose_service_decayed() {
    let t0 = Instant::now();
    let mut q = FlowQueue::new(1.0, t0);
    q.push(admission(0, "a", 100.0, later(t0, 30)), 0);
    q.push(admission(0, "b", 100.0, later(t0, 30)), 1);
    assert_eq!(q.pop(t0, |_, _| true).unwrap().item, 0);
    q.prune(later(t0, 20), 0.01);
    // a: idle, 100 x 2^-20 < 0.01: forgotten; b: still queued.
    let flows: Vec<String> = q
        .served_all(t0)
        .iter()
        .map(|(_, f, _)| f.to_string())
        .collect();
    assert_eq!(flows, ["b"]);
}

#[test]
fn random_operations_keep_the_counts_and_the_order_consistent() {
    // A small deterministic generator: push, pop, remove, expire in any order.
    let t0 = Instant::now();
    let mut q = FlowQueue::new(5.0, t0);
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut live: Vec<u64> = Vec::new();
    let mut popped_per_flow: HashMap<String, Vec<u64>> = HashMap::new();
    for step in 0..5000u64 {
        let now = t0 + Duration::from_millis(step * 10);
        match next() % 4 {
            0 | 1 => {
                let flow = format!("f{}", next() % 5);
                let band = (next() % 3) as i32 - 1;
                let deadline = now + Duration::from_millis(next() % 3000);
                let mut a = admission(band, &flow, (next() % 100) as f64, deadline);
                // Held for one of two pods, or for any.
                a.pod = match next() % 3 {
                    0 => None,
                    n => Some(SocketAddr::from(([10, 0, 0, n as u8], 80))),
                };
                let id = q.push(a, step);
                live.push(id);
            }
            2 => {
                // Some pods can take, some cannot.
                let open = next() % 4;
                let can = |pod: Option<SocketAddr>| match pod {
                    None => open & 1 == 0,
                    Some(p) => open & 2 == 0 || p.ip().to_string().ends_with(".1"),
                };
                if let Some(p) = q.pop(now, |_, pod| can(pod)) {
                    assert!(can(p.admission.pod), "only a pod that can take");
                    live.retain(|i| *i != p.id);
                    popped_per_flow
                        .entry(format!(
                            "{}/{}/{:?}",
                            p.admission.priority, p.admission.flow, p.admission.pod
                        ))
                        .or_default()
                        .push(p.id);
                }
            }
            _ => {
                if !live.is_empty() && next() % 2 == 0 {
                    let i = (next() as usize) % live.len();
                    assert!(q.remove(live.swap_remove(i)).is_some());
                } else {
                    for (id, _, _) in q.expire(now) {
                        live.retain(|i| *i != id);
                    }
                }
            }
        }
        assert_eq!(q.len(), live.len());
        let per_pod: usize = [None, Some(1u8), Some(2)]
            .into_iter()
            .map(|n| q.pool_len("m", n.map(|n| SocketAddr::from(([10, 0, 0, n], 80)))))
            .sum();
        assert_eq!(per_pod, live.len());
        assert_eq!(q.bytes(), live.len() * 100);
        assert_eq!(q.depths().iter().map(|(_, n)| n).sum::<usize>(), live.len());
        assert!(q.band_order_is_consistent());
    }
    // Within a flow (and band), for the same pod, dispatch is in arrival order.
    for ids in popped_per_flow.values() {
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    }
}

impl<T> FlowQueue<T> {
    /// Every band's order holds exactly its flows with queued requests, keyed on their head.
    fn band_order_is_consistent(&self) -> bool {
        self.bands.values().all(|band| {
            let active: usize = band.flows.values().filter(|f| f.live > 0).count();
            band.order.len() == active
                && band.flows.values().all(|f| match &f.key {
                    Some(k) => {
                        f.live > 0
                            && band.order.contains(k)
                            && f.queue.front() == Some(&k.head)
                            && k.served == f.served
                    }
                    None => f.live == 0,
                })
        })
    }
}
