//! Failures over chords, as over the ring: a frame out of turn is refused naming its sender, a
//! dropped rank is named by every rank, an abort reaches the ranks behind two stalled
//! neighbours, and a stalled rank is blamed exactly. Bounded as the rest of [`super`]: every
//! wait by its collective timeout, every ring within [`LIMIT`].

use super::*;

#[test]
fn a_frame_of_a_later_way_on_a_shared_stream_is_refused_naming_its_sender() {
    // Four ranks, two ways both to the rank opposite: rank 0 labels its frames as the next
    // way's, so rank 2 reads, where way 0's first frame belongs, one of way 1's. Ranks 1 and 3,
    // which finish, hold their rings until every rank is done: a rank that closes its ring fails
    // its neighbours' calls, which would hide the refusal under test.
    let done = Arc::new(Barrier::new(4));
    let results = chord_ring(4, Chords::Always, LIMIT, move |rank, mut ring| {
        let shift = usize::from(rank == 0);
        let error = hops(&mut ring, &[2, 2], (1, 64, false), shift).err();
        done.wait();
        error
    });
    let error = results[2].clone().expect("rank 2 refuses the frame");
    assert!(matches!(error, CollectiveError::MalformedFrame { peer: 0, .. }), "{error}");
}

#[test]
fn a_dropped_rank_fails_every_rank_naming_it_over_chords() {
    // Eight ranks form chords by default. Rank 3 leaves before the first call; every other rank
    // fails its first or second call, naming it.
    let results = chord_ring(8, Chords::Auto, LIMIT, |rank, mut ring| {
        assert_eq!(ring.peer_stats().len(), 5, "rank {rank}: the ring and three chords");
        let link = ring.ring.as_ref().expect("a ring");
        // The ring, the chords, and the same peers the other way round (6 is -2 at 8 ranks).
        for offset in [1, -1, 2, -2, 4, -4, 6, -7] {
            assert!(link.carries(Route { offset }), "offset {offset}");
        }
        for offset in [0, 3, -3, 5, 8] {
            assert!(!link.carries(Route { offset }), "offset {offset}");
        }
        if rank == 3 {
            return None;
        }
        let failed = (0..2).find_map(|_| hops(&mut ring, &offsets(8), (2, 1000, true), 0).err());
        Some(failed.unwrap_or_else(|| panic!("rank {rank}: both calls passed")))
    });
    for (rank, error) in results.into_iter().enumerate() {
        let Some(error) = error else { continue };
        assert_eq!(error.peer(), Some(3), "rank {rank}: {error}");
        if [2, 4, 1, 5, 7].contains(&rank) {
            // A peer of rank 3 may hear first of another peer's failure, never blame another.
            let cause = match &error {
                CollectiveError::Aborted { cause, .. } => &**cause,
                other => other,
            };
            assert_eq!(*cause, CollectiveError::PeerClosed { peer: 3 }, "rank {rank}");
        }
    }
}

#[test]
fn an_abort_reaches_the_ranks_behind_two_stalled_neighbours_over_chords() {
    // Rank 0 gives up at once; its ring neighbours 1 and 7 do not call until the others have
    // failed, so only the chords (0 to 2, 4 and 6) carry its abort: ranks 2 to 6 must fail with
    // it, not with their own timeout, which would name rank 1 or 7 instead.
    let others_failed = Arc::new(Barrier::new(8));
    let timeout = Duration::from_secs(20);
    let results = chord_ring(8, Chords::Auto, timeout, move |rank, mut ring| {
        let stalled = rank == 1 || rank == 7;
        if stalled {
            others_failed.wait();
        }
        let error = if rank == 0 {
            let cause = CollectiveError::InvalidArgument { reason: "a test's".into() };
            ring.run(Op::AllgatherBytes, 0, |_, _, _| Err::<(), _>(cause)).unwrap_err()
        } else {
            ring.allgather_bytes(b"block").unwrap_err()
        };
        if !stalled {
            others_failed.wait();
        }
        error
    });
    for (rank, error) in results.into_iter().enumerate().skip(1) {
        assert!(
            matches!(error, CollectiveError::Aborted { origin: 0, .. }),
            "rank {rank}: {error}"
        );
    }
}

#[test]
fn a_stalled_rank_is_blamed_exactly_over_chords() {
    // Rank 5 never calls. Every round of the plan waits on the one before, so every rank ends
    // up waiting on it: its peers (4, 6, 3, 7, 1) directly, ranks 0 and 2 only through them.
    let timeout = Duration::from_millis(1500);
    let others_failed = Arc::new(Barrier::new(8));
    let results = chord_ring(8, Chords::Auto, timeout, move |rank, mut ring| {
        if rank == 5 {
            others_failed.wait();
            return None;
        }
        let started = Instant::now();
        let error = hops(&mut ring, &offsets(8)[..5], (1, 1000, true), 0).err();
        let took = started.elapsed();
        others_failed.wait();
        Some((error.expect("a call that waits on rank 5 fails"), took, ring.peer_stats()))
    });
    for (rank, result) in results.into_iter().enumerate() {
        let Some((error, took, peers)) = result else { continue };
        assert_eq!(error.peer(), Some(5), "rank {rank}: {error}");
        if let CollectiveError::Timeout { peer, .. } = error {
            assert!([4, 6, 3, 7, 1].contains(&rank), "rank {rank} timed out on rank {peer}");
            assert!(took >= timeout, "rank {rank} timed out after {took:?}");
        }
        if rank == 0 {
            // Rank 0 waited on its chord to rank 6 (way 2 comes from there), so the wait shows
            // on that peer.
            let six = peers.iter().find(|p| p.peer == 6).expect("a chord to rank 6");
            assert!(six.waited >= timeout / 2, "rank 0 waited {:?} on rank 6", six.waited);
        }
    }
}
