// Linked with the whole archive of one subsystem library and only the
// libraries it declares: if that library calls into a subsystem above it, this
// executable fails to link (see harness/CMakeLists.txt). It is never run.
int main() { return 0; }
