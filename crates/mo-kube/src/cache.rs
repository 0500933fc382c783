//! A watched, self-healing cache of one kind of object (a reflector store fed by a spawned
//! watch stream with backoff).

use futures::StreamExt;
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde::de::DeserializeOwned;
use std::fmt::Debug;

/// Starts watching `api` (filtered by `config`) and returns the store it keeps current.
pub fn cache<K>(api: Api<K>, config: watcher::Config) -> Store<K>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    cache_with(api, config, |_| {}, |_| {})
}

/// [`cache`], keeping only what `trim` leaves of each object, and calling `touched` with every
/// object the watch reports changed (after the store has it): one watch feeds both the store
/// and whoever reacts to changes.
pub fn cache_with<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: impl Fn(&mut K) + Send + 'static,
    touched: impl Fn(&K) + Send + 'static,
) -> Store<K>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (store, writer) = reflector::store();
    // Field ownership is never read from a cached object; it is often the largest part of it.
    let stream = reflector(
        writer,
        watcher(api, config).modify(move |object: &mut K| {
            object.managed_fields_mut().clear();
            trim(object);
        }),
    )
    .default_backoff()
    .touched_objects()
    .for_each(move |object| {
        if let Ok(object) = object {
            touched(&object);
        }
        futures::future::ready(())
    });
    tokio::spawn(stream);
    store
}
