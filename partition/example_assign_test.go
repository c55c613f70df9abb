package partition_test

import (
	"fmt"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/partition"
)

// printAssignment prints an assignment in lexical order of session ids.
func printAssignment(a map[uuid.UUID][]int) {
	ids := make([]uuid.UUID, 0, len(a))
	for s := range a {
		ids = append(ids, s)
	}
	slices.SortFunc(ids, func(x, y uuid.UUID) int { return strings.Compare(x.String(), y.String()) })
	for _, s := range ids {
		fmt.Println(s, a[s])
	}
}

// Two sessions share eight parts: the lexically first takes the lower half.
func ExampleAssign() {
	first := uuid.MustParse("5a1d0c3e-7b42-4f0e-9c61-2d8e4b7a9f10")
	second := uuid.MustParse("9e07b6a2-13c4-4d58-8a0f-6b2c71e3d5a4")

	// The order of the input does not matter.
	printAssignment(partition.Assign([]uuid.UUID{second, first}, 8))
	// Output:
	// 5a1d0c3e-7b42-4f0e-9c61-2d8e4b7a9f10 [0 1 2 3]
	// 9e07b6a2-13c4-4d58-8a0f-6b2c71e3d5a4 [4 5 6 7]
}

// A third session joins, first in lexical order. Assign recomputes
// the runs and moves five parts; AssignSticky, starting from the current
// owners, moves only the three the newcomer needs.
func ExampleAssignSticky() {
	first := uuid.MustParse("5a1d0c3e-7b42-4f0e-9c61-2d8e4b7a9f10")
	second := uuid.MustParse("9e07b6a2-13c4-4d58-8a0f-6b2c71e3d5a4")
	newcomer := uuid.MustParse("1c3f9e21-58ab-4c06-b1d7-0e4a92f6c835")

	before := partition.Assign([]uuid.UUID{first, second}, 8)
	live := []uuid.UUID{first, second, newcomer}

	plain := partition.Assign(live, 8)
	sticky := partition.AssignSticky(before, live, 8)
	fmt.Println("plain, moved", partition.Moved(before, plain))
	printAssignment(plain)
	fmt.Println("sticky, moved", partition.Moved(before, sticky))
	printAssignment(sticky)
	// Output:
	// plain, moved 5
	// 1c3f9e21-58ab-4c06-b1d7-0e4a92f6c835 [0 1 2]
	// 5a1d0c3e-7b42-4f0e-9c61-2d8e4b7a9f10 [3 4 5]
	// 9e07b6a2-13c4-4d58-8a0f-6b2c71e3d5a4 [6 7]
	// sticky, moved 3
	// 1c3f9e21-58ab-4c06-b1d7-0e4a92f6c835 [3 6 7]
	// 5a1d0c3e-7b42-4f0e-9c61-2d8e4b7a9f10 [0 1 2]
	// 9e07b6a2-13c4-4d58-8a0f-6b2c71e3d5a4 [4 5]
}

// Owner finds the session of one part without building the assignment.
func ExampleOwner() {
	first := uuid.MustParse("5a1d0c3e-7b42-4f0e-9c61-2d8e4b7a9f10")
	second := uuid.MustParse("9e07b6a2-13c4-4d58-8a0f-6b2c71e3d5a4")

	owner, ok := partition.Owner([]uuid.UUID{first, second}, 8, 5)
	fmt.Println(owner, ok)
	// Output:
	// 9e07b6a2-13c4-4d58-8a0f-6b2c71e3d5a4 true
}
