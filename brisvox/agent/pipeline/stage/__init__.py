"""Stage plumbing: the Stage base, the frames between stages, the call's IO and its context."""
