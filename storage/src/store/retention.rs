//! S-8, the store's side of retention: its requests to the committer (a purge step, a sweep
//! step: `log/purge.rs`) and its reads (tombstones, ended executions by time, purges not
//! finished).

use super::*;

impl Store {
    /// Queues a request other than a transition and waits for its answer.
    pub(super) fn request<T: Send + 'static>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T>>) -> Request,
    ) -> BoxFuture<'static, Result<T>> {
        if let Some(reason) = self.shared().failure() {
            return futures::future::ready(Err(Error::FailStop(reason))).boxed();
        }
        let Some(sender) = self.inner.sender.clone() else {
            return futures::future::ready(Err(Error::Closed)).boxed();
        };
        let (reply, answer) = oneshot::channel();
        let request = make(reply);
        async move {
            sender.send(request).await.map_err(|_| Error::Closed)?;
            answer.await.map_err(|_| Error::Closed)?
        }
        .boxed()
    }

    pub(super) fn read_purged(&self, execution_id: ExecutionId) -> Result<Option<PurgedRecord>> {
        let key = keys::purged(execution_id);
        match self.shared().db.get(key)? {
            Some(bytes) => codec::decode(&key, &bytes).map(Some),
            None => Ok(None),
        }
    }

    pub(super) fn read_ended_before(
        &self,
        before_ms: u64,
        after: Option<(u64, ExecutionId)>,
        limit: usize,
    ) -> Result<Vec<(u64, ExecutionId)>> {
        let db = &self.shared().db;
        let end = keys::ended(before_ms, ExecutionId::from_uuid(uuid::Uuid::nil()));
        let start = match after {
            Some((at, execution_id)) => keys::ended(at, execution_id),
            None => keys::ended(0, ExecutionId::from_uuid(uuid::Uuid::nil())),
        };
        let mut ended = Vec::new();
        for item in db.range(&start[..]..&end[..]) {
            if ended.len() >= limit {
                break;
            }
            let (key, _) = item?;
            let parts = keys::ended_parts(&key);
            if parts.is_some_and(|parts| Some(parts) != after) {
                ended.extend(parts);
            }
        }
        Ok(ended)
    }

    pub(super) fn read_purges_unfinished(&self) -> Result<Vec<ExecutionId>> {
        let mut unfinished = Vec::new();
        for item in self.shared().db.scan_prefix([keys::PURGED]) {
            let (key, value) = item?;
            let record: PurgedRecord = codec::decode(&key, &value)?;
            if !record.finished {
                unfinished.push(record.execution_id);
            }
        }
        Ok(unfinished)
    }
}
