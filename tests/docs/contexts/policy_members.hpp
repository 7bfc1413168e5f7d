// Context "policy_members": the block lists members of a policy type (declarations, as in the
// concept references): it is the body of a struct.
struct Policy {
// @block
};
