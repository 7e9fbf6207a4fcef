//! Candidate positions by pod slot, for the longest-match walk: "is this pod of a block's set a
//! candidate, and which one?" is asked once per pod of every set the walk reads (64 times for a
//! block all 64 pods hold).
//!
//! Algorithm: an open-addressing table of `(pod slot, position)` pairs, a power of two at least
//! twice the number of candidates, indexed by the top bits of a Fibonacci multiply of the slot
//! and probed linearly. It is rebuilt per call in a reused buffer (a fill and one store per
//! candidate), where sorting the candidates and binary-searching them cost a sort per call and
//! about six dependent compares per pod. A pod listed twice keeps its first position.

use super::PodSlot;

/// Marks an empty table cell (pod slots stay below 2^31).
const EMPTY: u32 = u32::MAX;

#[derive(Debug, Default)]
pub struct CandidatePositions {
    cells: Vec<(u32, u32)>,
    /// log2 of the table size.
    bits: u32,
}

impl CandidatePositions {
    /// Makes the table map each of `candidates` to its position in the slice.
    pub fn rebuild(&mut self, candidates: &[PodSlot]) {
        let size = (candidates.len() * 2).next_power_of_two().max(8);
        self.bits = size.trailing_zeros();
        self.cells.clear();
        self.cells.resize(size, (EMPTY, 0));
        let mask = size - 1;
        for (pos, pod) in candidates.iter().enumerate() {
            let mut i = self.home(*pod);
            loop {
                let (slot, _) = self.cells[i];
                if slot == pod.0 {
                    break;
                }
                if slot == EMPTY {
                    self.cells[i] = (pod.0, pos as u32);
                    break;
                }
                i = (i + 1) & mask;
            }
        }
    }

    /// The position of `pod` among the candidates of the last rebuild.
    pub fn position(&self, pod: PodSlot) -> Option<usize> {
        let mask = self.cells.len().checked_sub(1)?;
        let mut i = self.home(pod);
        loop {
            let (slot, pos) = self.cells[i];
            if slot == pod.0 {
                return Some(pos as usize);
            }
            if slot == EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    fn home(&self, pod: PodSlot) -> usize {
        (pod.0.wrapping_mul(0x9E37_79B9) >> (32 - self.bits)) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_every_candidate_and_nothing_else() {
        let mut table = CandidatePositions::default();
        assert_eq!(table.position(PodSlot(0)), None);
        for n in [0usize, 1, 3, 64, 100] {
            // Slots spaced so several share a home cell and runs wrap around the table's end.
            let candidates: Vec<PodSlot> = (0..n as u32).map(|i| PodSlot(i * 37 + 5)).collect();
            table.rebuild(&candidates);
            for (pos, &pod) in candidates.iter().enumerate() {
                assert_eq!(table.position(pod), Some(pos), "n={n} pod={pod:?}");
            }
            for absent in [0, 1, 4, 6, 100_000, (1 << 31) - 1] {
                assert_eq!(table.position(PodSlot(absent)), None, "n={n}");
            }
        }
    }

    #[test]
    fn a_pod_listed_twice_keeps_its_first_position() {
        let mut table = CandidatePositions::default();
        table.rebuild(&[PodSlot(7), PodSlot(9), PodSlot(7)]);
        assert_eq!(table.position(PodSlot(7)), Some(0));
        assert_eq!(table.position(PodSlot(9)), Some(1));
    }
}
