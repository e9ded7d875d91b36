"""S-Store's voter-with-leaderboard benchmark, the first sstore workload.

Votes for TV-show contestants arrive on the border stream ``votes``; a validation procedure
rejects bad ones, a tally keeps totals, the lowest contestant is removed every N valid votes,
and a tuple window over the valid votes keeps a trending leaderboard. See ``procedures``.
"""

from sstore.workloads.voter.generator import batches, generate_votes
from sstore.workloads.voter.procedures import declare, leaderboard, voter_counts
from sstore.workloads.voter.run import VoterHalted, run_voter

__all__ = ["VoterHalted", "batches", "declare", "generate_votes", "leaderboard", "run_voter",
           "voter_counts"]
