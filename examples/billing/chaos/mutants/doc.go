// Package mutants is the mutation test of the proof: each file
// testdata/NAME.patch is a deliberate bug, a small diff against the module,
// of a kind that a weaker audit once let pass. The test applies each patch
// to a throwaway copy of the module, builds billing from it, and runs one
// billing chaos run against that binary (paysim and devkafka stay the
// unmutated idem's: the ground truth is never mutated). Every mutant must
// make the run fail with the violation named for it, and the same run
// against unmutated billing must pass, so that a catch is the bug's doing
// and not the configuration's.
//
// A patch that no longer applies fails the test by name: a mutant is never
// skipped. docs/proof.md lists the mutants and what catches each.
//
//	make mutants
package mutants
