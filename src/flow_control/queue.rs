//! The flow-control queue, pure: priority bands, flows within a band, FIFO within a flow, and
//! the order in which queued requests leave (no clock of its own, no locks, no I/O: the caller
//! passes `now`).
//!
//! - **Bands**: the highest priority with a queued request dispatches first.
//! - **Flows**: within a band, the next request comes from the flow that has received the least
//!   service lately: the weighted tokens dispatched for it, each charge decaying with a
//!   half-life. Every flow decays at the same rate, so the order of two flows only changes when
//!   one is charged: each flow's service is kept scaled to a fixed epoch (`sum of w x
//!   2^((t - epoch) / halfLife)`), and the flows with queued requests sit in an ordered set on
//!   that value (ties: the flow whose head arrived first). A dispatch is O(log flows); the
//!   epoch moves (every value rescaled, O(flows)) once the scale passes 2^32.
//! - **Within a flow**: arrival order. A request that leaves early (cancelled, expired,
//!   displaced) is removed from the counts at once and skipped when its flow reaches it; a
//!   flow's list is compacted when more than half of it is gone.
//! - **Pools**: each request names the pool it needs (its model) and, when it is held for one
//!   pod's cache, that pod; [`FlowQueue::pop`] is given which (pool, pod) can take a request
//!   now and takes, from the first flow in the order that has one, its oldest request that can
//!   go: within a flow, arrival order per (pool, pod), so a request held for a full pod does not
//!   hold up its flow's requests for other pods. A flow none of whose requests can go waits,
//!   its place kept. [`FlowQueue::pool_len`] counts the requests queued per (pool, pod).
//! - **Displacement**: [`FlowQueue::displace`] removes the newest request of the heaviest flow
//!   of the lowest band below a given priority, only among negative priorities (sheddable
//!   requests are the first to go when the queue is full).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

/// Past this scale (`2^((now - epoch) / halfLife)`), every flow's value is rescaled to `now`.
const RESCALE_AT: f64 = 4_294_967_296.0;

/// A request's place in the queue: its band, its flow, its pool, what it weighs.
#[derive(Debug, Clone, PartialEq)]
pub struct Admission {
    /// The priority band (higher dispatches first; negative: sheddable).
    pub priority: i32,
    /// The flow (the fairness id; one default flow without it).
    pub flow: Arc<str>,
    /// The pool the request needs (the model): it leaves only when that pool can take it.
    pub pool: Arc<str>,
    /// The pod of `pool` it is held for (its pick, bound there by its cache); `None`: any.
    pub pod: Option<SocketAddr>,
    /// The request's size, for the queue's byte bound.
    pub bytes: usize,
    /// The service its dispatch charges its flow, in weighted tokens.
    pub cost: f64,
    /// When it leaves the queue unserved (TTL).
    pub deadline: Instant,
}

/// A request leaving the queue for dispatch.
#[derive(Debug)]
pub struct Popped<T> {
    pub id: u64,
    pub item: T,
    pub admission: Admission,
}

/// A queued request.
#[derive(Debug)]
struct Entry<T> {
    item: T,
    admission: Admission,
}

/// A flow's place in its band's order: its scaled service, its head's arrival, its name.
#[derive(Debug, Clone)]
struct FlowKey {
    served: f64,
    head: u64,
    flow: Arc<str>,
}

impl PartialEq for FlowKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for FlowKey {}
impl PartialOrd for FlowKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for FlowKey {
    fn cmp(&self, other: &Self) -> Ordering {
        self.served
            .total_cmp(&other.served)
            .then(self.head.cmp(&other.head))
            .then_with(|| self.flow.cmp(&other.flow))
    }
}

/// One flow of a band.
#[derive(Debug, Default)]
struct Flow {
    /// Entry ids (arrival order: ids grow) of which some may have left (skipped).
    queue: VecDeque<u64>,
    /// Entries of `queue` still queued.
    live: usize,
    /// Service, scaled to the queue's epoch.
    served: f64,
    /// Its key in the band's order while it has queued requests.
    key: Option<FlowKey>,
}

/// One priority band.
#[derive(Debug, Default)]
struct Band {
    flows: HashMap<Arc<str>, Flow>,
    /// The flows with queued requests, least served first.
    order: BTreeSet<FlowKey>,
    live: usize,
}

/// The queue (see the module header).
#[derive(Debug)]
pub struct FlowQueue<T> {
    half_life: f64,
    epoch: Instant,
    bands: BTreeMap<i32, Band>,
    entries: HashMap<u64, Entry<T>>,
    deadlines: BTreeSet<(Instant, u64)>,
    next: u64,
    bytes: usize,
    /// Requests queued per pool and pod (none left out).
    pools: HashMap<Arc<str>, HashMap<Option<SocketAddr>, usize>>,
    /// Entries of `pools`' inner maps.
    pool_pods: usize,
}

impl<T> FlowQueue<T> {
    /// An empty queue whose charges decay with `half_life` seconds, its epoch `now`.
    pub fn new(half_life: f64, now: Instant) -> FlowQueue<T> {
        FlowQueue {
            half_life: if half_life > 0.0 { half_life } else { 60.0 },
            epoch: now,
            bands: BTreeMap::new(),
            entries: HashMap::new(),
            deadlines: BTreeSet::new(),
            next: 0,
            bytes: 0,
            pools: HashMap::new(),
            pool_pods: 0,
        }
    }

    /// Requests queued.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes queued.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The pools with requests queued.
    pub fn pools(&self) -> impl Iterator<Item = &Arc<str>> {
        self.pools.keys()
    }

    /// Requests queued for `pool` held for `pod` (`None`: for any of its pods).
    pub fn pool_len(&self, pool: &str, pod: Option<SocketAddr>) -> usize {
        self.pools
            .get(pool)
            .and_then(|p| p.get(&pod))
            .copied()
            .unwrap_or(0)
    }

    /// Requests queued per band, highest priority first (bands with none left out).
    pub fn depths(&self) -> Vec<(i32, usize)> {
        self.bands
            .iter()
            .rev()
            .filter(|(_, b)| b.live > 0)
            .map(|(p, b)| (*p, b.live))
            .collect()
    }

    /// The scale of a charge made at `now`: `2^((now - epoch) / halfLife)`.
    fn scale(&self, now: Instant) -> f64 {
        let t = now.saturating_duration_since(self.epoch).as_secs_f64();
        (t / self.half_life).exp2()
    }

    /// Queues `item`; returns its id.
    pub fn push(&mut self, admission: Admission, item: T) -> u64 {
        let id = self.next;
        self.next += 1;
        self.bytes += admission.bytes;
        let n = self
            .pools
            .entry(admission.pool.clone())
            .or_default()
            .entry(admission.pod)
            .or_default();
        if *n == 0 {
            self.pool_pods += 1;
        }
        *n += 1;
        self.deadlines.insert((admission.deadline, id));
        let band = self.bands.entry(admission.priority).or_default();
        let flow = band.flows.entry(admission.flow.clone()).or_default();
        flow.queue.push_back(id);
        flow.live += 1;
        band.live += 1;
        if flow.key.is_none() {
            let key = FlowKey {
                served: flow.served,
                head: id,
                flow: admission.flow.clone(),
            };
            flow.key = Some(key.clone());
            band.order.insert(key);
        }
        self.entries.insert(id, Entry { item, admission });
        id
    }

    /// The next request to dispatch: from the first flow in the order (bands, then least
    /// service) that has a request whose pool and pod `can_take` (asked at most once per pool
    /// and pod per call), its oldest such request; charges its flow the request's cost at
    /// `now`. Stops as soon as every (pool, pod) queued has said no.
    pub fn pop(
        &mut self,
        now: Instant,
        mut can_take: impl FnMut(&str, Option<SocketAddr>) -> bool,
    ) -> Option<Popped<T>> {
        let mut asked: Vec<(&Arc<str>, Option<SocketAddr>, bool)> = Vec::new();
        let mut refused = 0;
        let pools = self.pool_pods;
        let mut chosen = None;
        'bands: for (priority, band) in self.bands.iter().rev() {
            if band.live == 0 {
                continue;
            }
            for key in &band.order {
                let flow = &band.flows[&key.flow];
                for id in &flow.queue {
                    let Some(entry) = self.entries.get(id) else {
                        continue;
                    };
                    let (pool, pod) = (&entry.admission.pool, entry.admission.pod);
                    let ok = match asked.iter().find(|(p, d, _)| *p == pool && *d == pod) {
                        Some((_, _, v)) => *v,
                        None => {
                            let v = can_take(pool, pod);
                            asked.push((pool, pod, v));
                            refused += usize::from(!v);
                            v
                        }
                    };
                    if ok {
                        chosen = Some((*priority, key.flow.clone(), *id));
                        break 'bands;
                    }
                    if refused == pools {
                        return None;
                    }
                }
            }
        }
        let (priority, flow, id) = chosen?;
        let entry = self.take(id)?;
        self.charge_at(priority, &flow, entry.admission.cost, now);
        Some(Popped {
            id,
            item: entry.item,
            admission: entry.admission,
        })
    }

    /// Removes a queued request (cancelled, expired): `None` if it already left.
    pub fn remove(&mut self, id: u64) -> Option<(T, Admission)> {
        self.take(id).map(|e| (e.item, e.admission))
    }

    /// Removes and returns every request whose deadline is not after `now`.
    pub fn expire(&mut self, now: Instant) -> Vec<(u64, T, Admission)> {
        let mut out = Vec::new();
        while let Some(&(deadline, id)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            if let Some(e) = self.take(id) {
                out.push((id, e.item, e.admission));
            } else {
                self.deadlines.remove(&(deadline, id));
            }
        }
        out
    }

    /// The earliest deadline queued.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|(d, _)| *d)
    }

    /// Room for a request of priority `priority`: removes the newest request of the heaviest
    /// flow in the lowest band whose priority is negative and below `priority`.
    pub fn displace(&mut self, priority: i32) -> Option<(u64, T, Admission)> {
        let (_, band) = self
            .bands
            .iter()
            .find(|(p, b)| **p < 0 && **p < priority && b.live > 0)?;
        let key = band.order.last()?;
        let flow = &band.flows[&key.flow];
        let id = flow
            .queue
            .iter()
            .rev()
            .find(|id| self.entries.contains_key(id))
            .copied()?;
        self.take(id).map(|e| (id, e.item, e.admission))
    }

    /// Charges `tokens` of service to `flow` in band `priority` at `now` (a dispatch, or a
    /// correction once the response's size is known).
    pub fn charge(&mut self, priority: i32, flow: &str, tokens: f64, now: Instant) {
        let Some(name) = self
            .bands
            .get(&priority)
            .and_then(|b| b.flows.get_key_value(flow))
            .map(|(k, _)| k.clone())
        else {
            return;
        };
        self.charge_at(priority, &name, tokens, now);
    }

    fn charge_at(&mut self, priority: i32, flow: &Arc<str>, tokens: f64, now: Instant) {
        if !(tokens.is_finite() && tokens > 0.0) {
            return;
        }
        let mut scale = self.scale(now);
        if scale > RESCALE_AT {
            self.rescale(now);
            scale = 1.0;
        }
        let Some(band) = self.bands.get_mut(&priority) else {
            return;
        };
        let Some(f) = band.flows.get_mut(flow) else {
            return;
        };
        f.served += tokens * scale;
        if let Some(old) = f.key.take() {
            band.order.remove(&old);
            let key = FlowKey {
                served: f.served,
                ..old
            };
            band.order.insert(key.clone());
            f.key = Some(key);
        }
    }

    /// The service `flow` in band `priority` has received, decayed to `now` (weighted tokens).
    pub fn served(&self, priority: i32, flow: &str, now: Instant) -> f64 {
        self.bands
            .get(&priority)
            .and_then(|b| b.flows.get(flow))
            .map_or(0.0, |f| f.served / self.scale(now))
    }

    /// Every flow's decayed service at `now`, per band (highest first), for the metrics.
    pub fn served_all(&self, now: Instant) -> Vec<(i32, Arc<str>, f64)> {
        let scale = self.scale(now);
        let mut out = Vec::new();
        for (p, band) in self.bands.iter().rev() {
            for (name, f) in &band.flows {
                out.push((*p, name.clone(), f.served / scale));
            }
        }
        out
    }

    /// Forgets flows with nothing queued whose service decayed under `below` tokens at `now`,
    /// and bands left without flows.
    pub fn prune(&mut self, now: Instant, below: f64) {
        let scale = self.scale(now);
        for band in self.bands.values_mut() {
            band.flows
                .retain(|_, f| f.live > 0 || f.served / scale >= below);
        }
        self.bands.retain(|_, b| !b.flows.is_empty());
    }

    /// Moves the epoch to `now`: every flow's value divided by the scale (the order unchanged).
    fn rescale(&mut self, now: Instant) {
        let scale = self.scale(now);
        self.epoch = now;
        for band in self.bands.values_mut() {
            let mut order = BTreeSet::new();
            for f in band.flows.values_mut() {
                f.served /= scale;
                if let Some(k) = &mut f.key {
                    k.served = f.served;
                    order.insert(k.clone());
                }
            }
            band.order = order;
        }
    }

    /// Takes entry `id` out of the queue: its counts at once, its flow re-keyed on its next
    /// head (or out of the order when it has none), its list compacted when mostly gone.
    fn take(&mut self, id: u64) -> Option<Entry<T>> {
        let entry = self.entries.remove(&id)?;
        let a = &entry.admission;
        self.bytes -= a.bytes;
        if let Some(pods) = self.pools.get_mut(&a.pool) {
            if let Some(n) = pods.get_mut(&a.pod) {
                *n -= 1;
                if *n == 0 {
                    pods.remove(&a.pod);
                    self.pool_pods -= 1;
                }
            }
            if pods.is_empty() {
                self.pools.remove(&a.pool);
            }
        }
        self.deadlines.remove(&(a.deadline, id));
        let band = self.bands.get_mut(&a.priority).expect("an entry's band");
        let flow = band.flows.get_mut(&a.flow).expect("an entry's flow");
        flow.live -= 1;
        band.live -= 1;
        let entries = &self.entries;
        while flow
            .queue
            .front()
            .is_some_and(|id| !entries.contains_key(id))
        {
            flow.queue.pop_front();
        }
        if flow.queue.len() > 2 * flow.live + 8 {
            flow.queue.retain(|id| entries.contains_key(id));
        }
        let head = flow.queue.front().copied();
        if let Some(old) = flow.key.take() {
            band.order.remove(&old);
            if let Some(head) = head {
                let key = FlowKey { head, ..old };
                band.order.insert(key.clone());
                flow.key = Some(key);
            }
        }
        Some(entry)
    }
}

#[cfg(test)]
mod tests;
