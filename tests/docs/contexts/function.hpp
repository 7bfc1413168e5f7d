// Context "function": the block is statements, the body of a function (compiled, never called).
void block() {
// @block
}
