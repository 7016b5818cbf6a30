"""Group names: the numbers of live groups of one name (hpccomm.names), without MPI."""

from hpccomm.names import Names, lowest_free, numbered


def test_lowest_free_is_the_lowest_number_no_member_holds():
    assert lowest_free([]) == 1
    assert lowest_free([0, 0]) == 1
    assert lowest_free([0b10]) == 2  # number 1 held
    assert lowest_free([0b10, 0b100]) == 3  # 1 on one member, 2 on another
    assert lowest_free([0b1010]) == 2  # 1 and 3 held: 2 is free
    assert lowest_free([(1 << 7000) - 2]) == 7000  # 1..6999 held
    assert numbered("world/dup", 1) == "world/dup"
    assert numbered("world/dup", 3) == "world/dup-3"


def test_a_number_held_twice_stays_held_until_both_release_it():
    # a group its program named "x-2" and the second of "x" may both hold it: freeing one
    # must not free the other's number
    names = Names()
    names.take("x", 1)
    names.take("x", 2)
    names.take("x", 2)
    assert names.mask("x") == 0b110
    names.release("x", 2)
    assert names.mask("x") == 0b110
    names.release("x", 2)
    assert names.mask("x") == 0b010
    names.release("x", 2)  # (once too often: nothing)
    names.release("y", 1)
    assert names
    names.release("x", 1)
    assert not names and names.mask("x") == 0


def test_many_live_groups_of_one_name_cost_little_per_creation():
    # a creation sends one int per name: a list of the numbers made dup() quadratic (18 KB
    # and a millisecond to merge per dup with 6,200 live ones, a review)
    names = Names()
    for k in range(1, 6201):
        names.take("world/dup", k)
    mask = names.mask("world/dup")
    assert mask.bit_length() == 6201 and len(repr(mask)) < 2000
    assert lowest_free([mask] * 4) == 6201
    names.release("world/dup", 17)
    assert lowest_free([names.mask("world/dup"), mask]) == 6201  # (held on another member)
    assert lowest_free([names.mask("world/dup")]) == 17
