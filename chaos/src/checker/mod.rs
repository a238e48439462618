//! (stub until the checker lands)
use crate::history::Entry;
#[derive(Debug, Clone, Default)]
pub struct CheckOptions { pub max_search_states: usize, pub final_phase_start_us: Option<u64> }
#[derive(Debug, Clone, serde::Serialize)]
pub struct Violation { pub kind: ViolationKind, pub key: Option<String>, pub message: String, pub entries: Vec<Entry> }
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum ViolationKind { CorruptRead }
#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckReport { pub operations: usize, pub acknowledged: usize, pub indeterminate: usize, pub failed: usize, pub keys: usize, pub violations: Vec<Violation>, pub inconclusive_keys: Vec<String> }
impl CheckReport { pub fn passed(&self) -> bool { self.violations.is_empty() } pub fn render(&self) -> String { String::new() } }
pub fn check(h: &[Entry], _o: &CheckOptions) -> CheckReport { CheckReport { operations: h.len(), acknowledged: 0, indeterminate: 0, failed: 0, keys: 0, violations: vec![], inconclusive_keys: vec![] } }
