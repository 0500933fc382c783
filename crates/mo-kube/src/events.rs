//! Kubernetes Events (events.k8s.io/v1) about clusters. A repeat of the same event (same
//! object, type, reason and note) within [`SERIES_TTL`] is counted in a series on the Event
//! already published; a different note is a new Event. kube-runtime's `Recorder` keys its
//! series without the note, so a cluster's later "Holding" reasons would be shown with the
//! first one's text: the event would not say why the operator holds now.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use std::collections::HashMap;
use std::sync::Mutex;

/// How long a published event can be continued as a series (client-go uses 6 minutes too).
pub const SERIES_TTL: SignedDuration = SignedDuration::from_secs(6 * 60);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// An event's identity; the note is kept as its hash (notes are long, and many are tracked
/// for a while after a burst).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    regarding_uid: String,
    type_: EventType,
    reason: String,
    note: u64,
}

fn note_hash(note: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    note.hash(&mut hasher);
    hasher.finish()
}

#[derive(Clone, Debug)]
struct Published {
    name: String,
    count: i32,
    last: Timestamp,
}

/// What to send for an event: a new Event, or the next count of one already published.
#[derive(Debug, PartialEq, Eq)]
enum Send {
    Create { name: String },
    Repeat { name: String, count: i32 },
}

/// The series bookkeeping, apart from the API calls.
#[derive(Default)]
struct Series {
    published: HashMap<Key, Published>,
}

impl Series {
    fn next(&mut self, key: Key, object: &str, now: Timestamp) -> Send {
        self.published
            .retain(|_, p| now.duration_since(p.last) < SERIES_TTL);
        match self.published.get_mut(&key) {
            Some(p) => {
                p.count += 1;
                p.last = now;
                Send::Repeat {
                    name: p.name.clone(),
                    count: p.count,
                }
            }
            None => {
                let name = format!("{object}.{:x}", now.as_nanosecond());
                self.published.insert(
                    key,
                    Published {
                        name: name.clone(),
                        count: 1,
                        last: now,
                    },
                );
                Send::Create { name }
            }
        }
    }

    /// A repeat the API server refused (the Event expired there): publish it anew next time.
    fn forget(&mut self, key: &Key) {
        self.published.remove(key);
    }
}

pub struct EventPublisher {
    client: Client,
    controller: String,
    instance: String,
    series: Mutex<Series>,
}

impl EventPublisher {
    pub fn new(client: Client, controller: &str, instance: &str) -> Self {
        EventPublisher {
            client,
            controller: controller.into(),
            instance: instance.into(),
            series: Mutex::new(Series::default()),
        }
    }

    /// Publishes an event about `regarding` (which must carry its namespace, name and UID).
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: &str,
    ) -> Result<(), kube::Error> {
        let namespace = regarding.namespace.clone().unwrap_or("default".into());
        let object = regarding.name.clone().unwrap_or(self.controller.clone());
        let key = Key {
            regarding_uid: regarding.uid.clone().unwrap_or_default(),
            type_,
            reason: reason.into(),
            note: note_hash(note),
        };
        let now = Timestamp::now();
        let send = self
            .series
            .lock()
            .expect("events lock")
            .next(key.clone(), &object, now);
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let result = match send {
            Send::Create { name } => {
                let event = Event {
                    metadata: ObjectMeta {
                        name: Some(name),
                        namespace: Some(namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    event_time: Some(MicroTime(now)),
                    type_: Some(type_.as_str().into()),
                    reason: Some(reason.into()),
                    action: Some(reason.into()),
                    note: Some(note.into()),
                    regarding: Some(regarding.clone()),
                    reporting_controller: Some(self.controller.clone()),
                    reporting_instance: Some(self.instance.clone()),
                    ..Event::default()
                };
                api.create(&PostParams::default(), &event).await.map(drop)
            }
            Send::Repeat { name, count } => {
                let series = EventSeries {
                    count,
                    last_observed_time: MicroTime(now),
                };
                let patch = serde_json::json!({"series": series});
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(drop)
            }
        };
        if result.is_err() {
            self.series.lock().expect("events lock").forget(&key);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(note: &str) -> Key {
        Key {
            regarding_uid: "c-uid".into(),
            type_: EventType::Normal,
            reason: "Holding".into(),
            note: note_hash(note),
        }
    }

    #[test]
    fn a_repeat_is_counted_and_a_new_note_is_a_new_event() {
        let mut s = Series::default();
        let t0 = Timestamp::from_second(1_000_000).unwrap();
        let first = s.next(key("waiting for log-2"), "mo", t0);
        let Send::Create { name } = first else {
            panic!("{first:?}")
        };
        assert_eq!(
            s.next(
                key("waiting for log-2"),
                "mo",
                t0 + SignedDuration::from_secs(1)
            ),
            Send::Repeat {
                name: name.clone(),
                count: 2
            }
        );
        // The operator now holds for another reason: that is what the event must say.
        let other = s.next(
            key("waiting for tn-0"),
            "mo",
            t0 + SignedDuration::from_secs(2),
        );
        assert!(matches!(other, Send::Create { name: n } if n != name));
        // The earlier reason, back within the TTL, continues its own series.
        assert_eq!(
            s.next(
                key("waiting for log-2"),
                "mo",
                t0 + SignedDuration::from_secs(3)
            ),
            Send::Repeat { name, count: 3 }
        );
    }

    #[test]
    fn a_series_ends_after_its_ttl_and_a_refused_repeat_starts_over() {
        let mut s = Series::default();
        let t0 = Timestamp::from_second(1_000_000).unwrap();
        s.next(key("a"), "mo", t0);
        let later = t0 + SERIES_TTL + SignedDuration::from_secs(1);
        assert!(matches!(s.next(key("a"), "mo", later), Send::Create { .. }));
        assert_eq!(s.published.len(), 1, "expired series are dropped");
        s.forget(&key("a"));
        assert!(matches!(s.next(key("a"), "mo", later), Send::Create { .. }));
    }
}
