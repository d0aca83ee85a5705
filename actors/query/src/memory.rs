//! Query memory: each query has its own pool (`query.memory_limit_bytes`) drawn from one pool
//! of the node (`query.node_memory_bytes`), so however many queries run, together they stay
//! within the node's budget. A reservation past either limit fails the query with DataFusion's
//! resources-exhausted error (a 400 naming the limit), never an allocation the node cannot hold.

use std::fmt;
use std::sync::Arc;

use datafusion::common::Result;
use datafusion::execution::memory_pool::{
    GreedyMemoryPool, MemoryLimit, MemoryPool, MemoryReservation,
};

/// One query's pool: its own limit, and the node's.
#[derive(Debug)]
pub struct QueryPool {
    own: GreedyMemoryPool,
    node: Arc<GreedyMemoryPool>,
}

impl QueryPool {
    pub fn new(limit: usize, node: Arc<GreedyMemoryPool>) -> QueryPool {
        QueryPool {
            own: GreedyMemoryPool::new(limit),
            node,
        }
    }
}

impl fmt::Display for QueryPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "query {} within node {}", self.own, self.node)
    }
}

impl MemoryPool for QueryPool {
    fn name(&self) -> &str {
        "corvid-query"
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.own.grow(reservation, additional);
        self.node.grow(reservation, additional);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.own.shrink(reservation, shrink);
        self.node.shrink(reservation, shrink);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> Result<()> {
        self.own.try_grow(reservation, additional)?;
        if let Err(err) = self.node.try_grow(reservation, additional) {
            self.own.shrink(reservation, additional);
            return Err(err);
        }
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.own.reserved()
    }

    fn memory_limit(&self) -> MemoryLimit {
        self.own.memory_limit()
    }
}

#[cfg(test)]
mod tests {
    use datafusion::execution::memory_pool::MemoryConsumer;

    use super::*;

    #[test]
    fn queries_share_the_node_budget_and_give_it_back() {
        let node = Arc::new(GreedyMemoryPool::new(100));
        let first: Arc<dyn MemoryPool> = Arc::new(QueryPool::new(80, Arc::clone(&node)));
        let second: Arc<dyn MemoryPool> = Arc::new(QueryPool::new(80, Arc::clone(&node)));
        let a = MemoryConsumer::new("a").register(&first);
        let b = MemoryConsumer::new("b").register(&second);
        a.try_grow(70).expect("within both limits");
        assert!(a.try_grow(20).is_err(), "past the query's own limit");
        assert!(b.try_grow(40).is_err(), "past what the node has left");
        assert_eq!(second.reserved(), 0, "a refused reservation holds nothing");
        b.try_grow(30).expect("what the node has left");
        drop(a);
        assert_eq!(node.reserved(), 30);
        b.try_grow(50).expect("freed memory is the node's again");
    }
}
